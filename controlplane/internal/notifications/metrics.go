package notifications

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the notification counters of seed §6.3, names exactly the contract's.
type Metrics struct {
	// Active is ws_notifications_active_connections: open connections on this replica.
	Active prometheus.Gauge
	// Forwarded is ws_notifications_forwarded_messages_total: messages written to a
	// client (one per connection that got it).
	Forwarded prometheus.Counter
	// WriteErrors is ws_notifications_write_errors_total: messages a client did not get
	// because its write failed or its queue was full.
	WriteErrors prometheus.Counter
}

// NewMetrics registers the counters on reg (the app registry behind /metrics).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ws_notifications_active_connections",
			Help: "Open /ws/notifications connections on this replica.",
		}),
		Forwarded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ws_notifications_forwarded_messages_total",
			Help: "Notification messages written to WebSocket clients (one per receiving connection).",
		}),
		WriteErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ws_notifications_write_errors_total",
			Help: "Notification messages not delivered to a connection: failed write or full send queue.",
		}),
	}
	for _, c := range []prometheus.Collector{m.Active, m.Forwarded, m.WriteErrors} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("notifications metrics: %w", err)
		}
	}
	return m, nil
}
