// Package obs sets up the observability every Gantry binary shares: structured JSON logs
// that carry the request's correlation and trace ids on every line, and the tracer
// provider that mints trace ids. It never exports raw request bodies or secrets.
package obs

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"math/rand/v2"

	"github.com/gantry-gpu/gantry/shared/correlation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"
)

// NewLogger returns a JSON logger that adds service, correlation_id, trace_id and span_id
// to every record logged with a request context.
func NewLogger(w io.Writer, service string, level slog.Level) *slog.Logger {
	base := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})
	return slog.New(contextHandler{base}).With("service", service)
}

type contextHandler struct{ slog.Handler }

func (h contextHandler) Handle(ctx context.Context, r slog.Record) error {
	if id := correlation.ID(ctx); id != "" {
		r.AddAttrs(slog.String("correlation_id", id))
	}
	if tid, sid := correlation.TraceIDs(ctx); tid != "" {
		r.AddAttrs(slog.String("trace_id", tid), slog.String("span_id", sid))
	}
	return h.Handler.Handle(ctx, r)
}

func (h contextHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return contextHandler{h.Handler.WithAttrs(attrs)}
}

func (h contextHandler) WithGroup(name string) slog.Handler {
	return contextHandler{h.Handler.WithGroup(name)}
}

// NewTracerProvider returns the SDK provider, sampling per the caller's traceparent
// (and everything at the root), for when spans are exported.
func NewTracerProvider() *sdktrace.TracerProvider {
	return sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
}

// NewIDTracerProvider mints trace and span ids and propagates them, recording nothing.
// It is what runs while no span exporter is configured: the ids still join logs, errors,
// audit rows and events, without the SDK's per-span bookkeeping on every request.
func NewIDTracerProvider() trace.TracerProvider { return idProvider{} }

type idProvider struct{ embedded.TracerProvider }

func (idProvider) Tracer(string, ...trace.TracerOption) trace.Tracer { return idTracer{} }

type idTracer struct{ embedded.Tracer }

func (idTracer) Start(ctx context.Context, _ string, _ ...trace.SpanStartOption) (context.Context, trace.Span) {
	parent := trace.SpanContextFromContext(ctx)
	cfg := trace.SpanContextConfig{TraceFlags: trace.FlagsSampled}
	if parent.IsValid() {
		cfg.TraceID, cfg.TraceFlags, cfg.TraceState = parent.TraceID(), parent.TraceFlags(), parent.TraceState()
	} else {
		binary.NativeEndian.PutUint64(cfg.TraceID[:8], rand.Uint64())
		binary.NativeEndian.PutUint64(cfg.TraceID[8:], rand.Uint64())
	}
	binary.NativeEndian.PutUint64(cfg.SpanID[:], rand.Uint64()|1) // never the invalid zero id
	span := noop.Span{}
	sc := trace.NewSpanContext(cfg)
	return trace.ContextWithSpan(ctx, idSpan{Span: span, sc: sc}), idSpan{Span: span, sc: sc}
}

type idSpan struct {
	noop.Span
	sc trace.SpanContext
}

func (s idSpan) SpanContext() trace.SpanContext { return s.sc }
