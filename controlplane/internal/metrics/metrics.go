// Package metrics owns the control plane's Prometheus registry and the API counters of
// seed §6.3 that the request chain maintains. Names are the contract's, exactly; features
// register their own collectors on the same registry.
package metrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// API holds the request-chain metrics.
type API struct {
	Registry *prometheus.Registry

	RateLimitFailOpen         prometheus.Counter
	IdempotencyPersistedJSON  prometheus.Counter
	IdempotencySkippedEmpty   prometheus.Counter
	IdempotencySkippedNonJSON prometheus.Counter
	IdempotencyReplays        prometheus.Counter

	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// New registers the API metrics (and the Go and process collectors) on a fresh registry.
func New() *API {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := &API{
		Registry: reg,
		RateLimitFailOpen: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "api_ratelimit_fail_open_total",
			Help: "Requests let through because the rate-limit store was unavailable.",
		}),
		IdempotencyPersistedJSON: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "api_idempotency_persisted_body_json_total",
			Help: "Idempotent responses whose sanitized JSON body was stored for replay.",
		}),
		IdempotencySkippedEmpty: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "api_idempotency_skipped_body_empty_total",
			Help: "Idempotent responses with an empty body, not persisted.",
		}),
		IdempotencySkippedNonJSON: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "api_idempotency_skipped_body_non_json_total",
			Help: "Idempotent responses with a non-JSON body, not persisted.",
		}),
		IdempotencyReplays: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "api_idempotency_replays_served_total",
			Help: "Stored responses replayed for a repeated Idempotency-Key.",
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "api_http_requests_total",
			Help: "HTTP requests by route pattern, method and status code.",
		}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "api_http_request_duration_seconds",
			Help:    "HTTP request latency by route pattern and method.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"route", "method"}),
	}
	reg.MustRegister(m.RateLimitFailOpen, m.IdempotencyPersistedJSON, m.IdempotencySkippedEmpty,
		m.IdempotencySkippedNonJSON, m.IdempotencyReplays, m.requests, m.duration)
	return m
}

// Handler serves the registry in the Prometheus exposition format.
func (m *API) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{})
}

// Middleware counts requests and their latency by chi route pattern (never the raw
// path: ids would explode cardinality). Unrouted requests count as "unmatched".
func (m *API) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		route := "unmatched"
		if rc := chi.RouteContext(r.Context()); rc != nil {
			if p := rc.RoutePattern(); p != "" {
				route = p
			}
		}
		m.requests.WithLabelValues(route, r.Method, strconv.Itoa(sw.status)).Inc()
		m.duration.WithLabelValues(route, r.Method).Observe(time.Since(start).Seconds())
	})
}

type statusWriter struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.status, w.wroteHeader = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wroteHeader = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer (flush, hijack).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
