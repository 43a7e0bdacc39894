package proxy

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	requests      *prometheus.CounterVec
	streamsOpened prometheus.Counter
	openFailed    prometheus.Counter
	websockets    prometheus.Gauge
	exchanged     prometheus.Counter
	replays       prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "app_proxy_requests_total",
			Help: "Requests to the app proxy by outcome (ok, websocket, denied, not_found, not_running, rate_limited, upstream_error)."}, []string{"outcome"}),
		streamsOpened: prometheus.NewCounter(prometheus.CounterOpts{Name: "app_proxy_streams_opened_total",
			Help: "Fabric streams opened to apps (connections; kept alive across requests)."}),
		openFailed: prometheus.NewCounter(prometheus.CounterOpts{Name: "app_proxy_stream_open_failed_total",
			Help: "Fabric streams to apps that could not be opened."}),
		websockets: prometheus.NewGauge(prometheus.GaugeOpts{Name: "app_proxy_websockets_active",
			Help: "WebSockets (upgraded connections) this replica carries to apps now."}),
		exchanged: prometheus.NewCounter(prometheus.CounterOpts{Name: "app_proxy_exchange_consumed_ok_total",
			Help: "Exchange codes spent successfully (a cookie was set)."}),
		replays: prometheus.NewCounter(prometheus.CounterOpts{Name: "app_proxy_exchange_replay_rejected_total",
			Help: "Presentations of an exchange code that was already used."}),
	}
	if reg == nil {
		return m, nil
	}
	// A second service on the same registry (tests, the bench) shares the first's.
	register := func(c prometheus.Collector) (prometheus.Collector, error) {
		err := reg.Register(c)
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			return are.ExistingCollector, nil
		}
		return c, err
	}
	var err error
	var c prometheus.Collector
	if c, err = register(m.requests); err != nil {
		return nil, err
	}
	m.requests = c.(*prometheus.CounterVec)
	for _, g := range []*prometheus.Counter{&m.streamsOpened, &m.openFailed, &m.exchanged, &m.replays} {
		if c, err = register(*g); err != nil {
			return nil, err
		}
		*g = c.(prometheus.Counter)
	}
	if c, err = register(m.websockets); err != nil {
		return nil, err
	}
	m.websockets = c.(prometheus.Gauge)
	return m, nil
}
