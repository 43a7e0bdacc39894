package platformops

import (
	"context"

	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers implements the platform ops, releases and admin ops overview operations.
type Handlers struct {
	Svc *Service
}

const (
	signalsPath  = "/api/v1/v3/platform/ops/signals/"
	runbooksPath = "/api/v1/admin/runbooks/"
)

func apiSignal(s Signal) api.V3PlatformSignal {
	out := api.V3PlatformSignal{
		SignalKey: s.Key, Title: s.Title, Category: api.V3PlatformSignalCategory(s.Category),
		Severity: api.V3PlatformSignalSeverity(s.Severity), Count: int(s.Count), RunbookID: s.RunbookID,
		RunbookHref: runbooksPath + s.RunbookID, Summary: s.Summary, Href: signalsPath + s.Key,
		Evidence: make([]api.V3PlatformSignalEvidence, 0, len(s.Evidence)),
	}
	for _, e := range s.Evidence {
		out.Evidence = append(out.Evidence, api.V3PlatformSignalEvidence{Source: api.V3PlatformSignalEvidenceSource(e.Source),
			QueryID: e.QueryID, Value: e.Value, Threshold: e.Threshold, ObservedAt: e.ObservedAt})
	}
	return out
}

// GetV3PlatformOps implements GET /api/v1/v3/platform/ops.
func (h *Handlers) GetV3PlatformOps(ctx context.Context, _ api.GetV3PlatformOpsRequestObject) (api.GetV3PlatformOpsResponseObject, error) {
	sigs, now, err := h.Svc.Signals(ctx)
	if err != nil {
		return nil, err
	}
	status, active := Overall(sigs)
	out := api.V3PlatformOpsResponse{
		Overall: api.V3PlatformOpsOverall{Status: api.V3PlatformOpsOverallStatus(status), ActiveSignals: active, GeneratedAt: now},
		Signals: make([]api.V3PlatformSignal, 0, len(sigs)),
		Meta:    api.V3ReadModelMeta{GeneratedAt: now, Cache: "bypass"},
	}
	for _, s := range sigs {
		out.Signals = append(out.Signals, apiSignal(s))
	}
	return api.GetV3PlatformOps200JSONResponse{Body: out}, nil
}

// GetV3PlatformSignal implements GET /api/v1/v3/platform/ops/signals/{signal_key}.
func (h *Handlers) GetV3PlatformSignal(ctx context.Context, req api.GetV3PlatformSignalRequestObject) (api.GetV3PlatformSignalResponseObject, error) {
	if _, ok := Find(req.SignalKey); !ok {
		return nil, apierr.Validation("signal_key", "unknown signal %q", req.SignalKey).With("reason", "unknown_signal")
	}
	sigs, now, err := h.Svc.Signals(ctx)
	if err != nil {
		return nil, err
	}
	var sig Signal
	for _, s := range sigs {
		if s.Key == req.SignalKey {
			sig = s
		}
	}
	subs, err := h.Svc.Subjects(ctx, req.SignalKey)
	if err != nil {
		return nil, err
	}
	out := api.V3PlatformSignalResponse{Signal: apiSignal(sig), Subjects: make([]api.V3PlatformSignalSubject, 0, len(subs)),
		Meta: api.V3ReadModelMeta{GeneratedAt: now, Cache: "bypass"}}
	for _, s := range subs {
		out.Subjects = append(out.Subjects, api.V3PlatformSignalSubject{Kind: api.V3PlatformSignalSubjectKind(s.Kind), ID: s.ID,
			Label: s.Label, Since: s.Since, Detail: s.Detail})
	}
	return api.GetV3PlatformSignal200JSONResponse{Body: out}, nil
}

// GetAdminOpsOverview implements GET /api/v1/admin/ops/overview.
func (h *Handlers) GetAdminOpsOverview(ctx context.Context, _ api.GetAdminOpsOverviewRequestObject) (api.GetAdminOpsOverviewResponseObject, error) {
	cp, err := h.Svc.ControlPlaneBlock()
	if err != nil {
		return nil, err
	}
	c, err := h.Svc.Counts(ctx)
	if err != nil {
		return nil, err
	}
	sigs, now, err := h.Svc.Signals(ctx)
	if err != nil {
		return nil, err
	}
	var crit, warn int
	for _, s := range sigs {
		switch s.Severity {
		case SeverityCritical:
			crit++
		case SeverityWarning:
			warn++
		}
	}
	n := func(k string) int { return int(cp.Counters[k]) }
	out := api.AdminOpsOverview{
		ControlPlane: api.AdminOpsControlPlane{
			PlatformRoleListRequestsTotal:       n("platform_role_list_requests_total"),
			PlatformRoleBindRequestsTotal:       n("platform_role_bind_requests_total"),
			PlatformRoleRevokeRequestsTotal:     n("platform_role_revoke_requests_total"),
			PlatformRoleMutationSuccessTotal:    n("platform_role_mutation_success_total"),
			PlatformRoleMutationFailureTotal:    n("platform_role_mutation_failure_total"),
			PlatformRoleAdminDeniedTotal:        n("platform_role_admin_denied_total"),
			PlatformRoleServiceUnavailableTotal: n("platform_role_service_unavailable_total"),
			ReplicaID:                           cp.ReplicaID, Version: cp.Version, Commit: cp.Commit, StartedAt: cp.StartedAt.UTC(),
		},
		Fleet: api.AdminOpsFleet{NodesTotal: int(c.NodesTotal), NodesOnline: int(c.NodesOnline), NodesOffline: int(c.NodesOffline),
			NodesCordoned: int(c.NodesCordoned), GpusTotal: int(c.GPUsTotal), GpusUnhealthy: int(c.GPUsUnhealthy)},
		Allocations: api.AdminOpsAllocations{Live: int(c.Live), Provisioning: int(c.Provisioning), ReleaseFailed: int(c.ReleaseFailed), Failed: int(c.Failed)},
		Signals:     api.AdminOpsSignals{Critical: crit, Warning: warn},
		GeneratedAt: now,
	}
	return api.GetAdminOpsOverview200JSONResponse{Body: out}, nil
}

// ListPlatformReleases implements GET /api/v1/platform/releases.
func (h *Handlers) ListPlatformReleases(ctx context.Context, _ api.ListPlatformReleasesRequestObject) (api.ListPlatformReleasesResponseObject, error) {
	agents, err := h.Svc.AgentVersions(ctx)
	if err != nil {
		return nil, err
	}
	b := Build()
	v := b.Version
	comps := []api.PlatformComponentRelease{
		{Component: "controlplane", Version: &v, Commit: b.Commit, BuildTime: b.BuildTime, Source: "self"},
	}
	// The log gateway is its own process: what it runs is read from its build info gauge
	// where Prometheus scraped it, one entry per distinct build; unknown (never guessed)
	// when Prometheus cannot say.
	if gws, err := h.Svc.LogGatewayBuilds(ctx); err == nil && len(gws) > 0 {
		for _, g := range gws {
			var gv *string
			if g.Version != "" && g.Version != "unknown" {
				gv = &g.Version
			}
			comps = append(comps, api.PlatformComponentRelease{Component: "loggateway", Version: gv, Commit: g.Commit,
				BuildTime: g.BuildTime, Source: "prometheus"})
		}
	} else {
		comps = append(comps, api.PlatformComponentRelease{Component: "loggateway", Source: "unknown"})
	}
	agent := api.PlatformComponentRelease{Component: "nodeagent", Source: "unknown"}
	if len(agents) > 0 && agents[0].Version != "unknown" {
		av := agents[0].Version // the version most enrolled nodes run
		agent.Version, agent.Source = &av, "reported"
	}
	comps = append(comps, agent)
	out := api.PlatformReleasesResponse{ContractVersion: ContractVersion(), Components: comps,
		AgentVersions: make([]api.PlatformAgentVersion, 0, len(agents)), MixedAgentVersions: len(agents) > 1,
		GeneratedAt: h.Svc.Clock.Now().UTC()}
	for _, a := range agents {
		out.AgentVersions = append(out.AgentVersions, api.PlatformAgentVersion{Version: a.Version, Nodes: int(a.Nodes), NodesOnline: int(a.NodesOnline)})
	}
	return api.ListPlatformReleases200JSONResponse{Body: out}, nil
}
