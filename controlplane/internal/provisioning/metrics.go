package provisioning

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the provisioning control loop's (seed §6.3), names exactly the contract's.
// deploy/prometheus/gantry-provisioning.rules.yml alerts on them.
type Metrics struct {
	// QueueDepth is the consumer's pending messages: not yet delivered plus delivered
	// and not acknowledged (in flight, or waiting for a retry).
	QueueDepth prometheus.Gauge
	// DispatchLatency is from a task's creation to its agent's acknowledgement.
	DispatchLatency prometheus.Histogram
	// Timeouts counts tasks that no agent acknowledged before their deadline.
	Timeouts prometheus.Counter
	// Failures counts tasks the agent refused.
	Failures prometheus.Counter
	// ConsumerLag is the consumer's messages not yet delivered, by stream.
	ConsumerLag *prometheus.GaugeVec
}

// NewMetrics creates the metrics and registers them on reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		QueueDepth: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "provisioning_queue_depth",
			Help: "Provisioning dispatch messages pending: not yet delivered, in flight, or waiting for a retry.",
		}),
		DispatchLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "provisioning_dispatch_latency_seconds",
			Help:    "Time from an allocation task's creation to its node agent's acknowledgement.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
		}),
		Timeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "provisioning_timeouts_total",
			Help: "Allocation tasks no node agent acknowledged within the provisioning timeout.",
		}),
		Failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "provisioning_failures_total",
			Help: "Allocation tasks the node agent refused.",
		}),
		ConsumerLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nats_consumer_lag",
			Help: "Messages of the stream the consumer has not been delivered yet.",
		}, []string{"stream"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.QueueDepth, m.DispatchLatency, m.Timeouts, m.Failures, m.ConsumerLag} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("provisioning metrics: %w", err)
			}
		}
	}
	return m, nil
}
