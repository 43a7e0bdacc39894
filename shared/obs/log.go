// Package obs sets up the observability every Gantry binary shares: structured JSON logs
// that carry the request's correlation and trace ids on every line, and the tracer
// provider that mints trace ids. It never exports raw request bodies or secrets.
package obs

import (
	"context"
	"io"
	"log/slog"

	"github.com/gantry-gpu/gantry/shared/correlation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
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

// NewTracerProvider returns a provider that samples per the caller's traceparent (and
// everything at the root). Spans are not exported until an exporter is configured; the
// ids still join logs, errors, audit rows and events.
func NewTracerProvider() *sdktrace.TracerProvider {
	return sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
}
