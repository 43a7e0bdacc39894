package gateway

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/gantry-gpu/gantry/shared/obs"
)

// Outcome is the label of node_log_gateway_batches_total; every request to the gateway
// other than /healthz and /metrics ends in exactly one (seed §6.3).
type Outcome string

const (
	Accepted       Outcome = "accepted"
	RejectedAuth   Outcome = "rejected_auth"
	RejectedMethod Outcome = "rejected_method"
	RejectedSize   Outcome = "rejected_size"
	ForwardFailed  Outcome = "forward_failed"
)

// Outcomes lists every outcome, in the seed's order.
var Outcomes = []Outcome{Accepted, RejectedAuth, RejectedMethod, RejectedSize, ForwardFailed}

// Metrics are the gateway's collectors, named exactly as seed §6.3, plus one counter of
// ours for batches that are not a Loki push at all.
type Metrics struct {
	Registry       *prometheus.Registry
	Batches        *prometheus.CounterVec
	ForwardedBytes prometheus.Counter
	InFlight       prometheus.Gauge
	PushDuration   prometheus.Histogram
	// Invalid counts bodies that are not a well-formed Loki push (400). The seed's outcome
	// set has no value for them, so they are counted here and not in Batches.
	Invalid prometheus.Counter
}

// BuildInfoMetric is the gauge (always 1) whose labels say what this gateway runs:
// version, commit and build_time (the commit's time, RFC 3339), "unknown" when the
// binary was not stamped. The control plane reads it from Prometheus for the releases.
const BuildInfoMetric = "gantry_loggateway_build_info"

func newMetrics(build obs.Build) *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	buildTime := ""
	if !build.Time.IsZero() {
		buildTime = build.Time.UTC().Format(time.RFC3339)
	}
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: BuildInfoMetric,
		Help: "The gateway's version, commit and build time (always 1).",
		ConstLabels: prometheus.Labels{"version": orUnknown(build.Version), "commit": orUnknown(build.Commit),
			"build_time": orUnknown(buildTime)},
	})
	buildInfo.Set(1)
	reg.MustRegister(buildInfo)
	m := &Metrics{
		Registry: reg,
		Batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "node_log_gateway_batches_total",
			Help: "Log batches received from nodes, by outcome.",
		}, []string{"outcome"}),
		ForwardedBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "node_log_gateway_forwarded_bytes_total",
			Help: "Decompressed bytes of the push requests forwarded (after stamping node_id).",
		}),
		InFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "node_log_gateway_in_flight_requests",
			Help: "Push requests being handled now.",
		}),
		PushDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "node_log_gateway_push_duration_seconds",
			Help:    "Time to handle one push request, forwarding included.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		Invalid: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "node_log_gateway_invalid_batches_total",
			Help: "Push requests whose body is not a well-formed Loki push (answered 400).",
		}),
	}
	reg.MustRegister(m.Batches, m.ForwardedBytes, m.InFlight, m.PushDuration, m.Invalid)
	for _, o := range Outcomes {
		m.Batches.WithLabelValues(string(o))
	}
	return m
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
