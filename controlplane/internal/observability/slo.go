package observability

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/gantry-gpu/gantry/proto/api"
)

// SLOQuery is the filter and window of the slo-evidence read model (seed 4.2.3),
// already validated: From < To, and Range is the window they span.
type SLOQuery struct {
	Service, SLOID, ReleaseID string
	RangeName                 string // 1h .. 30d or custom
	From, To                  time.Time
	IncludeQueryOutcomes      bool
}

// sliMetric is the recording rule every SLO's SLI is recorded as.
const sliMetric = "slo:sli_ratio:rate5m"

// promRange renders d as a PromQL range (whole seconds).
func promRange(d time.Duration) string { return strconv.FormatInt(int64(d/time.Second), 10) + "s" }

// SLOEvidence is the slo-evidence read model (seed 4.2.4). Each SLO's value is the
// mean of its 5-minute SLI over the window (evaluated by Prometheus, never sampled
// here); the release gate is blocked when a required alert, route, drill or the SLO
// evidence itself is missing or failing.
func (s *Service) SLOEvidence(ctx context.Context, q SLOQuery, after string, pageSize int) (api.ObservabilitySloEvidenceResponse, bool) {
	snap := s.gatherAlerts(ctx)
	var recording map[string]bool
	if snap.promErr == nil {
		_, recording, _ = s.Prom.Rules(ctx)
	}
	out := api.ObservabilitySloEvidenceResponse{
		Items: []api.ObservabilitySloItem{},
		Meta: api.ObservabilitySloMeta{Sources: []api.ObservabilitySloMetaSources{
			api.ObservabilitySloMetaSourcesSloAlertPack, api.ObservabilitySloMetaSourcesAlertRuleManifest}},
	}
	if snap.promErr == nil {
		out.Meta.Sources = append(out.Meta.Sources, api.ObservabilitySloMetaSourcesPrometheusQueryOutcome)
	}
	if snap.routing != nil {
		out.Meta.Sources = append(out.Meta.Sources, api.ObservabilitySloMetaSourcesObservabilityOncallGate)
	}
	if q.ReleaseID != "" {
		out.Meta.Sources = append(out.Meta.Sources, api.ObservabilitySloMetaSourcesReleaseEvidence)
	}
	window := q.To.Sub(q.From)
	var reasons []string
	atRisk := false
	more := false
	for _, o := range s.Manifest.SLOs {
		if (q.Service != "" && o.Service != q.Service) || (q.SLOID != "" && o.ID != q.SLOID) {
			continue
		}
		it := api.ObservabilitySloItem{SloID: o.ID, Service: o.Service, OwnerTeam: o.OwnerTeam,
			EvidenceHref: "/api/v1/v3/platform/ops/observability/slo-evidence?slo_id=" + url.QueryEscape(o.ID),
			Objective:    api.ObservabilitySloObjective{Target: strconv.FormatFloat(o.Target, 'f', -1, 64), Unit: o.Unit, Window: o.Window},
			Current:      api.ObservabilitySloCurrent{Status: api.ObservabilitySloCurrentStatusUnknown, Value: "unknown"},
			QueryOutcome: api.ObservabilitySloQueryOutcome{Source: "prometheus",
				QueryID: fmt.Sprintf("%s:%s:%s", sliMetric, o.ID, q.RangeName)},
			AlertCoverage: api.ObservabilitySloAlertCoverage{RequiredAlerts: o.RequiredAlerts, Loaded: snap.promErr == nil, RouteConfigured: snap.routing != nil},
		}
		if !q.IncludeQueryOutcomes {
			it.QueryOutcome.QueryID = ""
		}

		for _, name := range o.RequiredAlerts {
			r, _ := s.Manifest.Alert(name)
			ai := s.alertItem(r, snap)
			if ai.State == api.ObservabilityAlertStateNotLoaded || ai.State == api.ObservabilityAlertStateUnknown {
				it.AlertCoverage.Loaded = false
				if ai.State == api.ObservabilityAlertStateNotLoaded {
					reasons = append(reasons, fmt.Sprintf("%s: required alert %s not loaded in Prometheus", o.ID, name))
				}
			}
			if !ai.Route.Configured {
				it.AlertCoverage.RouteConfigured = false
				if routeKnown(ai) {
					reasons = append(reasons, fmt.Sprintf("%s: required alert %s has no Alertmanager route", o.ID, name))
				}
			}
			if ai.Drill.State == api.ObservabilityAlertDrillStateMissing || ai.Drill.State == api.ObservabilityAlertDrillStateStale {
				reasons = append(reasons, fmt.Sprintf("%s: drill of route %s %s", o.ID, ai.Route.Destination, ai.Drill.State))
			}
		}

		switch {
		case snap.promErr != nil:
			it.QueryOutcome.State = api.ObservabilitySloQueryOutcomeStateFailed
		case !recording[sliMetric]:
			it.QueryOutcome.State = api.ObservabilitySloQueryOutcomeStateNotLoaded
			reasons = append(reasons, fmt.Sprintf("%s: recording rule %s not loaded", o.ID, sliMetric))
		default:
			v, err := s.Prom.Scalar(ctx, fmt.Sprintf(`avg_over_time(%s{slo_id=%q}[%s])`, sliMetric, o.ID, promRange(window)), q.To)
			checked := snap.now
			it.QueryOutcome.CheckedAt = &checked
			switch {
			case err != nil:
				it.QueryOutcome.State = api.ObservabilitySloQueryOutcomeStateFailed
				reasons = append(reasons, fmt.Sprintf("%s: SLI query failed", o.ID))
			case v == nil:
				// No traffic in the window is no evidence, not compliance.
				it.QueryOutcome.State = api.ObservabilitySloQueryOutcomeStateStale
				reasons = append(reasons, fmt.Sprintf("%s: no SLI samples in the window", o.ID))
			default:
				it.QueryOutcome.State = api.ObservabilitySloQueryOutcomeStateFresh
				budget := 1 - o.Target
				remaining := 100 * (1 - (1-*v)/budget)
				remaining = max(0, min(100, remaining))
				it.Current.Value = strconv.FormatFloat(*v, 'f', 5, 64)
				it.Current.ErrorBudgetRemainingPercent = float32(remaining)
				switch {
				case remaining <= 0:
					it.Current.Status = api.ObservabilitySloCurrentStatusExhausted
					reasons = append(reasons, fmt.Sprintf("%s: error budget exhausted", o.ID))
				case remaining < 25:
					it.Current.Status = api.ObservabilitySloCurrentStatusAtRisk
					atRisk = true
				default:
					it.Current.Status = api.ObservabilitySloCurrentStatusWithinBudget
				}
			}
		}
		if o.ID <= after {
			continue
		}
		if len(out.Items) == pageSize {
			more = true
			continue
		}
		out.Items = append(out.Items, it)
	}

	ov := &out.Overall
	ov.EnvironmentProfile, ov.GeneratedAt = s.Config.Profile, snap.now
	if q.ReleaseID != "" {
		rid := q.ReleaseID
		ov.ReleaseID = &rid
	}
	gate := &out.ReleaseGate
	gate.BlockingReasons = []string{}
	gate.AttachableEvidenceHref = "/api/v1/v3/platform/ops/observability/slo-evidence?time_range=" + url.QueryEscape(q.RangeName)
	if q.ReleaseID != "" {
		gate.AttachableEvidenceHref += "&release_id=" + url.QueryEscape(q.ReleaseID)
	}
	switch {
	case snap.promErr != nil:
		gate.State = api.ObservabilityReleaseGateStateUnknown
		gate.BlockingReasons = append(gate.BlockingReasons, "prometheus unreachable: SLO evidence cannot be classified")
		ov.Status = api.ObservabilityOverallStatusUnknown
		ov.Summary = "Prometheus is unreachable; no SLO can be classified."
	case len(reasons) > 0:
		gate.State = api.ObservabilityReleaseGateStateBlocked
		gate.BlockingReasons = dedupe(reasons)
		ov.Status = api.ObservabilityOverallStatusBlocked
		ov.Summary = fmt.Sprintf("Release gate blocked: %d finding(s).", len(gate.BlockingReasons))
	case atRisk || snap.routing == nil:
		gate.State = api.ObservabilityReleaseGateStateOpen
		ov.Status = api.ObservabilityOverallStatusDegraded
		ov.Summary = "SLOs within budget but at risk, or routes unverified."
	default:
		gate.State = api.ObservabilityReleaseGateStateOpen
		ov.Status = api.ObservabilityOverallStatusHealthy
		ov.Summary = "Every SLO within budget; required alerts loaded, routed and drilled."
	}
	if snap.routing == nil && snap.promErr == nil && gate.State == api.ObservabilityReleaseGateStateOpen {
		gate.State = api.ObservabilityReleaseGateStateBlocked
		gate.BlockingReasons = append(gate.BlockingReasons, "alertmanager unreachable: routes cannot be verified")
		ov.Status = api.ObservabilityOverallStatusBlocked
	}
	return out, more
}

func dedupe(ss []string) []string {
	seen := map[string]bool{}
	out := []string{}
	for _, s := range ss {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
