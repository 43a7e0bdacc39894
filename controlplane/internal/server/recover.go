package server

import (
	"log/slog"
	"net/http"
	"runtime/debug"

	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/correlation"
)

// recoverer turns a panic into internal_error. It sits outermost (ARCHITECTURE §3), so
// it reads the correlation id from the response header the next layer set; the stack
// goes to the log only, never to the client.
func recoverer(m errorMapper, log *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tw := &trackingWriter{ResponseWriter: w}
			defer func() {
				p := recover()
				if p == nil {
					return
				}
				if p == http.ErrAbortHandler {
					panic(p)
				}
				ctx := correlation.WithID(r.Context(), w.Header().Get(correlation.HeaderRequestID))
				log.ErrorContext(ctx, "panic serving request", "panic", p, "stack", string(debug.Stack()), "method", r.Method, "path", r.URL.Path)
				if tw.wrote {
					// Too late for an envelope; end the response.
					return
				}
				m.writer.Write(w, r.WithContext(ctx), apierr.New(apierr.InternalError, "internal error"))
			}()
			next.ServeHTTP(tw, r)
		})
	}
}

type trackingWriter struct {
	http.ResponseWriter
	wrote bool
}

func (w *trackingWriter) WriteHeader(code int) { w.wrote = true; w.ResponseWriter.WriteHeader(code) }
func (w *trackingWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}
func (w *trackingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
