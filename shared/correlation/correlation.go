// Package correlation owns the request's correlation id and its trace context: it reads
// them from incoming requests (X-Request-Id, traceparent), echoes them on responses
// (X-Request-Id, traceparent, X-Trace-ID), and carries them onto outgoing messages
// (x-correlation-id, traceparent, tracestate headers on events).
//
// Every log line, audit row, event and error envelope takes its correlation id from here.
package correlation

import (
	"context"
	"net/http"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// MaxIDLength is the longest X-Request-Id we accept (seed §8); a longer or malformed one
// is replaced by a minted id rather than refused, so a client bug never blocks a call.
const MaxIDLength = 128

const (
	HeaderRequestID = "X-Request-Id"
	HeaderTraceID   = "X-Trace-ID"
	// HeaderEventCorrelation is the event-bus header of seed §6.1.
	HeaderEventCorrelation = "x-correlation-id"
)

type idKey struct{}

// ID is the correlation id of ctx, "" outside a request.
func ID(ctx context.Context) string {
	id, _ := ctx.Value(idKey{}).(string)
	return id
}

// WithID returns ctx carrying id.
func WithID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, idKey{}, id)
}

// Valid reports whether a client-supplied id may be used as it is: 1..128 visible ASCII
// characters, so it is safe in headers and log lines.
func Valid(id string) bool {
	if len(id) == 0 || len(id) > MaxIDLength {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= 0x20 || id[i] >= 0x7f {
			return false
		}
	}
	return true
}

// NewID mints a correlation id.
func NewID() string {
	if u, err := uuid.NewV7(); err == nil {
		return u.String()
	}
	return uuid.NewString()
}

// Middleware accepts the caller's X-Request-Id when valid, else mints one, and echoes it.
func Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(HeaderRequestID)
		if !Valid(id) {
			id = NewID()
		}
		// Assigned under the canonical key directly: Header.Set would re-validate and
		// re-canonicalise it on every request.
		w.Header()[HeaderRequestID] = []string{id}
		// Later layers (the contract validator among them) see the effective id, so an
		// over-long client id is replaced, never refused.
		r.Header[HeaderRequestID] = []string{id}
		next.ServeHTTP(w, r.WithContext(WithID(r.Context(), id)))
	})
}

// TraceIDs are the hex trace and span ids of the span in ctx, empty when there is none.
func TraceIDs(ctx context.Context) (traceID, spanID string) {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return "", ""
	}
	return sc.TraceID().String(), sc.SpanID().String()
}

var (
	propagator       = propagation.TraceContext{}
	canonicalTraceID = http.CanonicalHeaderKey(HeaderTraceID)
)

// Tracing starts a server span per request, continuing the caller's traceparent when it
// sends one, and answers with traceparent and X-Trace-ID.
func Tracing(tp trace.TracerProvider, service string) func(http.Handler) http.Handler {
	tracer := tp.Tracer(service)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx := propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
			ctx, span := tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer))
			defer span.End()
			sc := span.SpanContext()
			if sc.IsValid() {
				h := w.Header()
				h[canonicalTraceID] = []string{sc.TraceID().String()}
				propagator.Inject(ctx, propagation.HeaderCarrier(h))
			}
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
}

// Inject writes the correlation id and trace context of ctx into message headers.
func Inject(ctx context.Context, set func(key, value string)) {
	if id := ID(ctx); id != "" {
		set(HeaderEventCorrelation, id)
	}
	carrier := propagation.MapCarrier{}
	propagator.Inject(ctx, carrier)
	for k, v := range carrier {
		set(k, v)
	}
}

// Extract is the reverse of Inject, for consumers.
func Extract(ctx context.Context, get func(key string) string) context.Context {
	if id := get(HeaderEventCorrelation); id != "" {
		ctx = WithID(ctx, id)
	}
	carrier := propagation.MapCarrier{}
	for _, k := range propagator.Fields() {
		if v := get(k); v != "" {
			carrier[k] = v
		}
	}
	return propagator.Extract(ctx, carrier)
}
