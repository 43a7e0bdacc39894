package observability

import (
	"context"
	"time"

	"github.com/gantry-gpu/gantry/shared/clock"
)

// Config is the observability settings of the control plane.
type Config struct {
	// PrometheusURL and AlertmanagerURL are where the read models ask; empty means not
	// configured, which the read models report (unknown, prometheus_reachable false)
	// rather than fail on.
	PrometheusURL   string `env:"GANTRY_PROMETHEUS_URL"`
	AlertmanagerURL string `env:"GANTRY_ALERTMANAGER_URL"`
	// Profile is the active runtime profile (environment_profile of every answer).
	Profile string `env:"GANTRY_ENVIRONMENT_PROFILE" envDefault:"dev"`
	// DrillStaleAfter is the age after which a drill no longer proves a route works.
	DrillStaleAfter time.Duration `env:"GANTRY_ALERT_DRILL_STALE_AFTER" envDefault:"168h"`
	// ReceiverTokenFile holds the bearer token Alertmanager's webhooks carry to the
	// control plane's alert receiver (the file deploy/alertmanager's credentials_file
	// names); empty: the receiver refuses every delivery.
	ReceiverTokenFile string `env:"GANTRY_ALERT_RECEIVER_TOKEN_FILE"`
	// GrafanaURL, when set, is offered as the escape hatch for raw telemetry (optional:
	// never required for release validation).
	GrafanaURL string `env:"GANTRY_GRAFANA_URL"`
}

// DrillEvidence is the latest drill arrival per Alertmanager receiver, and the
// receivers with a drill fired but not arrived yet.
type DrillEvidence interface {
	Latest(ctx context.Context) (arrived map[string]time.Time, pending map[string]bool, err error)
}

// Service computes the observability read models.
type Service struct {
	Manifest *Manifest
	Prom     *Prometheus   // nil: not configured
	AM       *Alertmanager // nil: not configured
	Drills   DrillEvidence // nil: no drill store (every route's drill is missing)
	Clock    clock.Clock
	Config   Config
	// Components says how each component of the profile is doing outside Prometheus
	// (database, queue, event bus, cache, runtime): see health.go.
	Components ComponentProbes
}

// NewService builds a Service from cfg and the embedded manifest.
func NewService(m *Manifest, cfg Config, clk clock.Clock) (*Service, error) {
	p, err := NewPrometheus(cfg.PrometheusURL)
	if err != nil {
		return nil, err
	}
	if cfg.DrillStaleAfter <= 0 {
		cfg.DrillStaleAfter = 7 * 24 * time.Hour
	}
	return &Service{Manifest: m, Prom: p, AM: NewAlertmanager(cfg.AlertmanagerURL), Clock: clk, Config: cfg}, nil
}

// errNotConfigured stands for a source the control plane was not given an address for.
var errNotConfigured = errorString("not configured")

type errorString string

func (e errorString) Error() string { return string(e) }
