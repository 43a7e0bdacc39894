package terminal

import "github.com/prometheus/client_golang/prometheus"

// metrics are the terminal counters of seed §6.3 and a gauge of live bridges.
//
// What counts: consumed_ok is every token whose single consume won and which was
// presented for its own allocation (a session attempt then follows). replay_rejected is
// every presentation of a token that exists and was already consumed (the losers of a
// race, and any later replay). Unknown tokens, expired unused tokens and a token
// presented for another allocation (which spends it) count in neither.
type metrics struct {
	consumedOK     prometheus.Counter
	replayRejected prometheus.Counter
	attached       prometheus.Gauge

	// SSH streams (/ws/ssh): connections by outcome (opened: bridged to the node's SSH
	// server; open_failed: the node could not be reached or refused the stream), the
	// live ones, and the bytes carried each way.
	sshConnections *prometheus.CounterVec
	sshActive      prometheus.Gauge
	sshBytes       *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		consumedOK: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "terminal_token_consumed_ok_total",
			Help: "Terminal tokens consumed successfully (one WebSocket each).",
		}),
		replayRejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "terminal_token_replay_rejected_total",
			Help: "Presentations of an already consumed terminal token, refused as token_invalid.",
		}),
		attached: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "terminal_websockets_active",
			Help: "Terminal WebSockets bridged by this replica now.",
		}),
		sshConnections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ssh_connections_total",
			Help: "SSH WebSocket connections admitted with a valid token, by outcome (opened, open_failed).",
		}, []string{"outcome"}),
		sshActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ssh_websockets_active",
			Help: "SSH WebSockets bridged to a node by this replica now.",
		}),
		sshBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ssh_bytes_total",
			Help: "Bytes carried on SSH streams, by direction (to_node, from_node).",
		}, []string{"direction"}),
	}
	for _, o := range []string{"opened", "open_failed"} {
		m.sshConnections.WithLabelValues(o)
	}
	for _, d := range []string{"to_node", "from_node"} {
		m.sshBytes.WithLabelValues(d)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.consumedOK, m.replayRejected, m.attached, m.sshConnections, m.sshActive, m.sshBytes} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
