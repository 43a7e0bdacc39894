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
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.consumedOK, m.replayRejected, m.attached} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
