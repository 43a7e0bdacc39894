package maas

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the lifecycle's Prometheus series (docs/maas.md, Metrics).
type Metrics struct {
	Started  *prometheus.CounterVec
	Outcomes *prometheus.CounterVec
	Steps    *prometheus.HistogramVec
	// StepAge is how long the oldest running workflow has been in its current step.
	StepAge *prometheus.GaugeVec
}

// NewMetrics returns unregistered metrics; Register adds them to a registry.
func NewMetrics() *Metrics {
	return &Metrics{
		Started: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gantry_maas_workflows_started_total",
			Help: "MAAS onboardings and decommissions started."}, []string{"workflow"}),
		Outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gantry_maas_workflows_total",
			Help: "MAAS onboardings and decommissions by outcome (succeeded, failed, aborted)."}, []string{"workflow", "outcome"}),
		Steps: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gantry_maas_step_duration_seconds",
			Help:    "Duration of MAAS workflow steps from start to end, by result.",
			Buckets: []float64{0.1, 1, 5, 15, 60, 300, 900, 1800, 3600}}, []string{"workflow", "step", "result"}),
		StepAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gantry_maas_step_age_seconds",
			Help: "Seconds the oldest running MAAS workflow has spent in its current step (refreshed with the scheduled sync)."},
			[]string{"workflow", "step"}),
	}
}

// Register adds the metrics to reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.Started, m.Outcomes, m.Steps, m.StepAge} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (m *Metrics) started(wf string)          { m.Started.WithLabelValues(wf).Inc() }
func (m *Metrics) outcome(wf, outcome string) { m.Outcomes.WithLabelValues(wf, outcome).Inc() }
func (m *Metrics) step(wf, step, result string, d time.Duration) {
	m.Steps.WithLabelValues(wf, step, result).Observe(d.Seconds())
}
