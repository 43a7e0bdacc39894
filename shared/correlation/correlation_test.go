package correlation

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

func TestMiddlewareKeepsValidAndMintsInvalid(t *testing.T) {
	cases := []struct {
		name, in string
		keep     bool
	}{
		{"valid", "req-123", true},
		{"max length", strings.Repeat("a", 128), true},
		{"too long", strings.Repeat("a", 129), false},
		{"empty", "", false},
		{"control char", "a\x01b", false},
		{"space", "a b", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var seen string
			h := Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen = ID(r.Context()) }))
			req := httptest.NewRequest("GET", "/", nil)
			if tc.in != "" {
				req.Header.Set(HeaderRequestID, tc.in)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			got := rec.Header().Get(HeaderRequestID)
			if got != seen || got == "" {
				t.Fatalf("response id %q, context id %q", got, seen)
			}
			if tc.keep != (got == tc.in) {
				t.Fatalf("keep=%v but got %q for %q", tc.keep, got, tc.in)
			}
		})
	}
}

func TestTracingContinuesTraceparent(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	var traceID, spanID string
	h := Tracing(tp, "test")(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		traceID, spanID = TraceIDs(r.Context())
	}))
	req := httptest.NewRequest("GET", "/", nil)
	req.Header.Set("traceparent", parent)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if traceID != "4bf92f3577b34da6a3ce929d0e0e4736" || spanID == "00f067aa0ba902b7" || spanID == "" {
		t.Fatalf("trace %q span %q", traceID, spanID)
	}
	if rec.Header().Get(HeaderTraceID) != traceID {
		t.Fatalf("X-Trace-ID %q", rec.Header().Get(HeaderTraceID))
	}
	if tpOut := rec.Header().Get("traceparent"); !strings.Contains(tpOut, traceID) || !strings.Contains(tpOut, spanID) {
		t.Fatalf("traceparent out %q", tpOut)
	}

	// Without a parent a fresh trace is minted.
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Header().Get(HeaderTraceID) == "" || rec.Header().Get(HeaderTraceID) == "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("no fresh trace: %q", rec.Header().Get(HeaderTraceID))
	}
}

func TestInjectExtractRoundTrip(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("t").Start(WithID(context.Background(), "corr-1"), "op")
	defer span.End()
	hdr := map[string]string{}
	Inject(ctx, func(k, v string) { hdr[k] = v })
	if hdr[HeaderEventCorrelation] != "corr-1" || hdr["traceparent"] == "" {
		t.Fatalf("headers %v", hdr)
	}
	out := Extract(context.Background(), func(k string) string { return hdr[k] })
	if ID(out) != "corr-1" {
		t.Fatalf("id %q", ID(out))
	}
	if tid, _ := TraceIDs(ctx); tid == "" {
		t.Fatal("no trace id")
	}
}
