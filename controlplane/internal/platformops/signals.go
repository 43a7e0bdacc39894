// Package platformops serves what an on-call operator reads first (docs/operations.md,
// "Platform ops"; seed 4.3, 6.3, 9; issue 21): the platform health and action signals,
// each with a severity, a runbook id and the evidence it was derived from; the admin ops
// overview with its control_plane block; and the platform releases (component and
// node agent versions).
package platformops

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/clock"
)

// Severities (contract V3PlatformSignalSeverity).
const (
	SeverityOK       = "ok"
	SeverityWarning  = "warning"
	SeverityCritical = "critical"
	SeverityUnknown  = "unknown"
)

// Evidence sources.
const (
	SourceDatabase = "database"
	SourceMetrics  = "metrics"
)

// Evidence is one observation a signal was derived from: a count from a named query,
// never raw samples.
type Evidence struct {
	Source     string
	QueryID    string
	Value      int64
	Threshold  int64
	ObservedAt time.Time
}

// Signal is one platform signal at a point in time.
type Signal struct {
	Key       string
	Title     string
	Category  string
	Severity  string
	Count     int64
	RunbookID string
	Summary   string
	Evidence  []Evidence
}

// Definition is a signal the platform watches: its key, what it means, the runbook that
// says what to do (deploy/runbooks/<id>.md) and the severity while raised.
type Definition struct {
	Key       string
	Title     string
	Category  string
	RunbookID string
	Raised    string // severity while the count is at or above Threshold
	Threshold int64
	QueryID   string
	Source    string
	Describe  func(n int64) string
}

// Definitions lists the signals in the order the ops page shows them. Keys match the
// `signals` of the runbooks' front matter.
var Definitions = []Definition{
	{Key: "stuck_provisioning", Title: "Provisioning is stuck", Category: "provisioning", RunbookID: "ops.provisioning.stuck",
		Raised: SeverityCritical, Threshold: 1, QueryID: "allocations.requested_or_provisioning_past_timeout", Source: SourceDatabase,
		Describe: func(n int64) string {
			return fmt.Sprintf("%d allocation(s) have been requested or provisioning for longer than the provisioning timeout.", n)
		}},
	{Key: "nodes_offline", Title: "Nodes offline", Category: "nodes", RunbookID: "ops.nodes.offline",
		Raised: SeverityWarning, Threshold: 1, QueryID: "nodes.enrolled_offline", Source: SourceDatabase,
		Describe: func(n int64) string { return fmt.Sprintf("%d enrolled node(s) are offline (no fabric session).", n) }},
	{Key: "gpus_unhealthy", Title: "GPUs unhealthy", Category: "gpus", RunbookID: "ops.gpus.unhealthy",
		Raised: SeverityWarning, Threshold: 1, QueryID: "node_gpus.unhealthy", Source: SourceDatabase,
		Describe: func(n int64) string { return fmt.Sprintf("%d GPU(s) report unhealthy in their latest telemetry.", n) }},
	{Key: "release_failures", Title: "Release failures", Category: "allocations", RunbookID: "ops.allocations.release_failed",
		Raised: SeverityCritical, Threshold: 1, QueryID: "allocations.release_failed", Source: SourceDatabase,
		Describe: func(n int64) string {
			return fmt.Sprintf("%d allocation(s) failed to release; their GPUs stay reserved until a retry or a force-release.", n)
		}},
	{Key: "runway_exhaustion", Title: "Runway exhausted", Category: "billing", RunbookID: "ops.billing.runway",
		Raised: SeverityWarning, Threshold: 1, QueryID: "billing.runway_blocked_wallets", Source: SourceDatabase,
		Describe: func(n int64) string {
			return fmt.Sprintf("%d tenant wallet(s) ran below the runway floor; their running workloads are being stopped.", n)
		}},
	{Key: "log_gateway_rejections", Title: "Log gateway rejections", Category: "log_gateway", RunbookID: "ops.loggateway.rejections",
		Raised: SeverityWarning, Threshold: 1, QueryID: LogGatewayRejectionsQuery, Source: SourceMetrics,
		Describe: func(n int64) string {
			return fmt.Sprintf("The node log gateway rejected %d batch(es) in the last 15 minutes.", n)
		}},
}

// LogGatewayRejectionsQuery is the PromQL of the log gateway signal: the gateway is its
// own process, so its counters are read where Prometheus scraped them.
const LogGatewayRejectionsQuery = `sum(increase(node_log_gateway_batches_total{outcome=~"rejected_.*"}[15m]))`

// Metrics answers PromQL: a scalar (nil: no data) and the label sets of a vector;
// observability.Prometheus does.
type Metrics interface {
	Scalar(ctx context.Context, query string, at time.Time) (*float64, error)
	LabelSets(ctx context.Context, query string, at time.Time) ([]map[string]string, error)
}

// Service computes the signals, the overview and the releases.
type Service struct {
	Pool *pgxpool.Pool
	// Clock is control-plane time; every age is measured with it.
	Clock clock.Clock
	Log   *slog.Logger
	// ProvisioningTimeout is the allocations' provisioning timeout: an allocation
	// requested or provisioning for longer is stuck.
	ProvisioningTimeout time.Duration
	// Metrics is Prometheus; nil when not configured (the metrics-derived signals are
	// then unknown, never made up).
	Metrics Metrics
	// Gatherer is this replica's registry (the control_plane counters).
	Gatherer  prometheus.Gatherer
	ReplicaID string
	StartedAt time.Time
}

// Signals computes every signal at now: the database counts in one statement, the
// metrics ones from Prometheus.
func (s *Service) Signals(ctx context.Context) ([]Signal, time.Time, error) {
	now := s.Clock.Now().UTC()
	var counts [5]int64
	err := db.Querier(ctx, s.Pool).QueryRow(ctx, `
SELECT
  (SELECT count(*) FROM allocations WHERE status IN ('requested', 'provisioning') AND updated_at < $1),
  (SELECT count(*) FROM nodes WHERE status = 'offline' AND enrolled_at IS NOT NULL),
  (SELECT count(*) FROM node_gpus WHERE healthy = false),
  (SELECT count(*) FROM allocations WHERE status = 'release_failed'),
  (SELECT count(*) FROM billing_runway_blocks)`, now.Add(-s.ProvisioningTimeout)).
		Scan(&counts[0], &counts[1], &counts[2], &counts[3], &counts[4])
	if err != nil {
		return nil, now, fmt.Errorf("platform signals: %w", err)
	}
	out := make([]Signal, 0, len(Definitions))
	for i, d := range Definitions {
		sig := Signal{Key: d.Key, Title: d.Title, Category: d.Category, RunbookID: d.RunbookID}
		var n int64
		known := true
		if d.Source == SourceDatabase {
			n = counts[i]
		} else {
			v, err := s.metric(ctx, d.QueryID, now)
			if err != nil {
				known = false
				sig.Summary = "Unknown: " + err.Error()
			} else {
				n = v
			}
		}
		switch {
		case !known:
			sig.Severity = SeverityUnknown
		case n >= d.Threshold:
			sig.Severity, sig.Count, sig.Summary = d.Raised, n, d.Describe(n)
		default:
			sig.Severity, sig.Summary = SeverityOK, d.Describe(0)
		}
		if known {
			sig.Evidence = []Evidence{{Source: d.Source, QueryID: d.QueryID, Value: n, Threshold: d.Threshold, ObservedAt: now}}
		} else {
			sig.Evidence = []Evidence{}
		}
		out = append(out, sig)
	}
	return out, now, nil
}

// metric reads a count from Prometheus, or says why it cannot.
func (s *Service) metric(ctx context.Context, query string, now time.Time) (int64, error) {
	if s.Metrics == nil {
		return 0, errString("Prometheus is not configured (GANTRY_PROMETHEUS_URL)")
	}
	v, err := s.Metrics.Scalar(ctx, query, now)
	if err != nil {
		s.log().Warn("platform signal: prometheus query failed", "error", err)
		return 0, errString("Prometheus did not answer")
	}
	if v == nil {
		return 0, nil // no series: nothing was rejected (or the gateway never pushed)
	}
	return int64(*v + 0.5), nil
}

type errString string

func (e errString) Error() string { return string(e) }

func (s *Service) log() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.Default()
}

// Find is the definition of key, false when none.
func Find(key string) (Definition, bool) {
	for _, d := range Definitions {
		if d.Key == key {
			return d, true
		}
	}
	return Definition{}, false
}

// Overall is the ops page's overall status: unhealthy when a signal is critical,
// degraded when one is warning or unknown, healthy otherwise; and how many are raised.
func Overall(sigs []Signal) (string, int) {
	status, active := "healthy", 0
	for _, s := range sigs {
		switch s.Severity {
		case SeverityCritical:
			status = "unhealthy"
			active++
		case SeverityWarning:
			if status != "unhealthy" {
				status = "degraded"
			}
			active++
		case SeverityUnknown:
			if status == "healthy" {
				status = "degraded"
			}
		}
	}
	return status, active
}
