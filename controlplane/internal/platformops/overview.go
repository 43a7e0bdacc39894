package platformops

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/proto/openapi"
	"github.com/gantry-gpu/gantry/shared/obs"
)

// ControlPlane is the overview's control_plane block: this replica's platform-role
// counters (seed 6.3, without the api_ prefix) and its identity.
type ControlPlane struct {
	Counters  map[string]int64
	ReplicaID string
	Version   string
	Commit    *string
	StartedAt time.Time
}

// roleCounters are the seed 6.3 platform-role counters, by their registry names.
var roleCounters = []string{
	"api_platform_role_list_requests_total", "api_platform_role_bind_requests_total",
	"api_platform_role_revoke_requests_total", "api_platform_role_mutation_success_total",
	"api_platform_role_mutation_failure_total", "api_platform_role_admin_denied_total",
	"api_platform_role_service_unavailable_total",
}

// ControlPlaneBlock reads the counters from this replica's registry (a counter not
// registered reads 0: seed 9, newer counters may be absent).
func (s *Service) ControlPlaneBlock() (ControlPlane, error) {
	out := ControlPlane{Counters: map[string]int64{}, ReplicaID: s.ReplicaID, StartedAt: s.StartedAt}
	for _, n := range roleCounters {
		out.Counters[strings.TrimPrefix(n, "api_")] = 0
	}
	if s.Gatherer != nil {
		mfs, err := s.Gatherer.Gather()
		if err != nil {
			return out, fmt.Errorf("gather metrics: %w", err)
		}
		for _, mf := range mfs {
			name := mf.GetName()
			if !strings.HasPrefix(name, "api_platform_role_") {
				continue
			}
			var sum float64
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			out.Counters[strings.TrimPrefix(name, "api_")] = int64(sum)
		}
	}
	b := Build()
	out.Version, out.Commit = b.Version, b.Commit
	return out, nil
}

// Fleet and allocation counts of the overview.
type Counts struct {
	NodesTotal, NodesOnline, NodesOffline, NodesCordoned, GPUsTotal, GPUsUnhealthy int64
	Live, Provisioning, ReleaseFailed, Failed                                      int64
}

// Counts reads the fleet and allocation counts in one statement.
func (s *Service) Counts(ctx context.Context) (Counts, error) {
	var c Counts
	err := db.Querier(ctx, s.Pool).QueryRow(ctx, `
SELECT
  (SELECT count(*) FROM nodes),
  (SELECT count(*) FROM nodes WHERE status = 'online'),
  (SELECT count(*) FROM nodes WHERE status = 'offline'),
  (SELECT count(*) FROM nodes WHERE schedule_state <> 'schedulable'),
  (SELECT count(*) FROM node_gpus),
  (SELECT count(*) FROM node_gpus WHERE healthy = false),
  (SELECT count(*) FROM allocations WHERE status NOT IN ('released', 'failed', 'completed')),
  (SELECT count(*) FROM allocations WHERE status IN ('requested', 'provisioning')),
  (SELECT count(*) FROM allocations WHERE status = 'release_failed'),
  (SELECT count(*) FROM allocations WHERE status = 'failed')`).
		Scan(&c.NodesTotal, &c.NodesOnline, &c.NodesOffline, &c.NodesCordoned, &c.GPUsTotal, &c.GPUsUnhealthy,
			&c.Live, &c.Provisioning, &c.ReleaseFailed, &c.Failed)
	if err != nil {
		return Counts{}, fmt.Errorf("ops counts: %w", err)
	}
	return c, nil
}

// Version is this build's version, set at link time:
// -ldflags "-X github.com/gantry-gpu/gantry/controlplane/internal/platformops.Version=1.2.3".
var Version = "dev"

// BuildInfo is a component's version, commit and build time.
type BuildInfo struct {
	Version   string
	Commit    *string
	BuildTime *time.Time
}

var (
	buildOnce sync.Once
	build     BuildInfo
)

// Build is this binary's build information: Version, and the commit and commit time Go
// stamped from version control (absent in test binaries and builds outside a checkout).
func Build() BuildInfo {
	buildOnce.Do(func() {
		b := obs.ReadBuild(Version)
		build.Version = b.Version
		if b.Commit != "" {
			build.Commit = &b.Commit
		}
		if !b.Time.IsZero() {
			build.BuildTime = &b.Time
		}
	})
	return build
}

// LogGatewayBuildsQuery is the PromQL of the log gateway's releases entry: the distinct
// builds among the gateways Prometheus scrapes now (a gateway that stopped is dropped
// by Prometheus's staleness handling, so it does not linger as "mixed").
const LogGatewayBuildsQuery = `count by (version, commit, build_time) (gantry_loggateway_build_info)`

// maxGatewayBuilds bounds the releases entries for the log gateway (the contract allows
// 16 components in all); more distinct builds than that is itself the finding.
const maxGatewayBuilds = 8

// LogGatewayBuilds are the distinct builds of the log gateway that Prometheus scraped,
// ordered by version then commit. A label the gateway exported as "unknown" (an unstamped
// binary) is absent here. The error says why Prometheus could not be asked; an empty
// result with no error means Prometheus has no series.
func (s *Service) LogGatewayBuilds(ctx context.Context) ([]BuildInfo, error) {
	if s.Metrics == nil {
		return nil, errString("Prometheus is not configured (GANTRY_PROMETHEUS_URL)")
	}
	sets, err := s.Metrics.LabelSets(ctx, LogGatewayBuildsQuery, s.Clock.Now())
	if err != nil {
		s.log().Warn("platform releases: prometheus query failed", "error", err)
		return nil, errString("Prometheus did not answer")
	}
	known := func(v string) *string {
		if v == "" || v == "unknown" {
			return nil
		}
		return &v
	}
	out := make([]BuildInfo, 0, len(sets))
	for _, ls := range sets {
		b := BuildInfo{Version: ls["version"], Commit: known(ls["commit"])}
		if t, err := time.Parse(time.RFC3339, ls["build_time"]); err == nil {
			t = t.UTC()
			b.BuildTime = &t
		}
		out = append(out, b)
	}
	deref := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	slices.SortFunc(out, func(a, b BuildInfo) int {
		if c := strings.Compare(a.Version, b.Version); c != 0 {
			return c
		}
		return strings.Compare(deref(a.Commit), deref(b.Commit))
	})
	if len(out) > maxGatewayBuilds {
		out = out[:maxGatewayBuilds]
	}
	return out, nil
}

// AgentVersion is how many enrolled nodes run one agent version.
type AgentVersion struct {
	Version      string
	Nodes        int64
	NodesOnline  int64
	Unidentified bool
}

// AgentVersions groups the enrolled nodes by the agent version they reported at
// enrollment or in their latest fabric hello, most nodes first.
func (s *Service) AgentVersions(ctx context.Context) ([]AgentVersion, error) {
	rows, err := db.Querier(ctx, s.Pool).Query(ctx, `
SELECT coalesce(agent_version, 'unknown'), count(*), count(*) FILTER (WHERE status = 'online')
FROM nodes WHERE enrolled_at IS NOT NULL
GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 200`)
	if err != nil {
		return nil, fmt.Errorf("agent versions: %w", err)
	}
	defer rows.Close()
	out := []AgentVersion{}
	for rows.Next() {
		var a AgentVersion
		if err := rows.Scan(&a.Version, &a.Nodes, &a.NodesOnline); err != nil {
			return nil, fmt.Errorf("agent versions: %w", err)
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

var (
	contractOnce    sync.Once
	contractVersion string
)

// ContractVersion is info.version of the embedded contract.
func ContractVersion() string {
	contractOnce.Do(func() {
		m := regexp.MustCompile(`(?m)^  version: *(\S+)\s*$`).FindSubmatch(openapi.Document)
		if m != nil {
			contractVersion = string(m[1])
		}
	})
	return contractVersion
}
