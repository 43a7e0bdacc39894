package observability

import (
	"context"
	"net/url"
	"sort"
	"time"

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"

	"github.com/gantry-gpu/gantry/proto/api"
)

// AlertsQuery is the filter of the alerts read model (seed 4.2.1), already validated.
type AlertsQuery struct {
	Severity, State                     string
	OwnerTeam, Service, Domain, Runbook string
	IncludeInactive                     bool
}

// alertsSnapshot is what the sources said, gathered once per request.
type alertsSnapshot struct {
	now time.Time
	// promErr is set when Prometheus is not configured or did not answer.
	promErr error
	loaded  map[string]promv1.AlertingRule
	// routing is the live Alertmanager configuration; nil when Alertmanager is not
	// configured or did not answer (routes are then unknown).
	routing *Routing
	amErr   error
	// suppressed holds the alert names whose every Alertmanager instance is silenced
	// or inhibited.
	suppressed map[string]bool
	arrived    map[string]time.Time
	pending    map[string]bool
}

func (s *Service) gatherAlerts(ctx context.Context) alertsSnapshot {
	snap := alertsSnapshot{now: s.Clock.Now().UTC()}
	if s.Prom == nil {
		snap.promErr = errNotConfigured
	} else {
		snap.loaded, _, snap.promErr = s.Prom.Rules(ctx)
	}
	if s.AM == nil {
		snap.amErr = errNotConfigured
	} else if snap.routing, snap.amErr = s.AM.Routing(ctx); snap.amErr == nil {
		var held []AMAlert
		if held, snap.amErr = s.AM.Alerts(ctx); snap.amErr != nil {
			snap.routing = nil
		}
		active := map[string]bool{}
		snap.suppressed = map[string]bool{}
		for _, a := range held {
			name := a.Labels["alertname"]
			if a.Status.State == "suppressed" {
				snap.suppressed[name] = true
			} else {
				active[name] = true
			}
		}
		for name := range active {
			delete(snap.suppressed, name) // one instance still notifies: not suppressed
		}
	}
	if s.Drills != nil {
		// Drill evidence missing is reported per route (drill state missing), not failed.
		snap.arrived, snap.pending, _ = s.Drills.Latest(ctx)
	}
	return snap
}

// alertItem classifies one manifest alert against the snapshot.
func (s *Service) alertItem(r Rule, snap alertsSnapshot) api.ObservabilityAlert {
	sev := api.ObservabilityAlertSeverity(r.Labels["severity"])
	if !alertSeverities[string(sev)] {
		sev = api.ObservabilityAlertSeverityUnknown
	}
	it := api.ObservabilityAlert{
		AlertName: r.Name, Severity: sev, OwnerTeam: r.Labels["owner_team"], Service: r.Labels["service"],
		Domain: r.Labels["domain"], RunbookID: r.Labels["runbook_id"], Summary: r.Annotations["summary"],
		SignalKey:    "alert:" + r.Name,
		RunbookHref:  "/api/v1/admin/runbooks/" + url.PathEscape(r.Labels["runbook_id"]),
		EvidenceHref: "/api/v1/v3/platform/ops/observability/alerts?include_inactive=true&runbook_id=" + url.QueryEscape(r.Labels["runbook_id"]),
	}

	switch loaded, ok := snap.loaded[r.Name]; {
	case snap.promErr != nil:
		it.State = api.ObservabilityAlertStateUnknown
	case !ok:
		it.State = api.ObservabilityAlertStateNotLoaded
	case loaded.State == "firing":
		it.State = api.ObservabilityAlertStateFiring
		if snap.suppressed[r.Name] {
			it.State = api.ObservabilityAlertStateSuppressed
		}
		for _, a := range loaded.Alerts {
			if a.State == promv1.AlertStateFiring && (it.LastFiredAt == nil || a.ActiveAt.Before(*it.LastFiredAt)) {
				at := a.ActiveAt.UTC()
				it.LastFiredAt = &at
			}
		}
	default: // inactive or pending: loaded and not firing
		it.State = api.ObservabilityAlertStateResolved
	}

	routing := snap.routing
	if routing == nil {
		routing = s.Manifest.Routing // what the repository says; not verified
	}
	labels := withName(r.Labels, r.Name)
	receivers := routing.Root.Receivers(labels)
	it.Route.Destination = receivers[0]
	for _, rc := range receivers {
		if routing.Delivering[rc] {
			it.Route.Destination = rc
			it.Route.Configured = true
			break
		}
	}
	if snap.routing != nil {
		at := snap.now
		it.Route.LastVerifiedAt = &at
	} else {
		it.Route.Configured = false
	}

	it.Drill.State = api.ObservabilityAlertDrillStateMissing
	if at, ok := snap.arrived[it.Route.Destination]; ok {
		at := at.UTC()
		it.Drill.LastDrillAt = &at
		it.Drill.State = api.ObservabilityAlertDrillStateCurrent
		if snap.now.Sub(at) > s.Config.DrillStaleAfter {
			it.Drill.State = api.ObservabilityAlertDrillStateStale
		}
	} else if snap.pending[it.Route.Destination] {
		it.Drill.State = api.ObservabilityAlertDrillStatePending
	}
	return it
}

// routeKnown reports whether an item's route was checked against a live Alertmanager.
func routeKnown(it api.ObservabilityAlert) bool { return it.Route.LastVerifiedAt != nil }

// Alerts is the alerts read model (seed 4.2.2): every alert of the rule manifest,
// classified by Prometheus's rule state, Alertmanager's routes and silences, and the
// drill evidence. overall describes every alert of the profile; rollups and items the
// filtered ones. after is the last alert name of the previous page.
func (s *Service) Alerts(ctx context.Context, q AlertsQuery, after string, pageSize int) (api.ObservabilityAlertsResponse, bool) {
	snap := s.gatherAlerts(ctx)
	out := api.ObservabilityAlertsResponse{
		Items: []api.ObservabilityAlert{},
		Meta: api.ObservabilityAlertsMeta{Sources: []api.ObservabilityAlertsMetaSources{
			api.ObservabilityAlertsMetaSourcesAlertRuleManifest, api.ObservabilityAlertsMetaSourcesRunbookIndex}},
		Rollups: api.ObservabilityAlertRollups{ByOwnerTeam: []api.ObservabilityTeamCount{}},
	}
	if snap.promErr == nil {
		out.Meta.Sources = append(out.Meta.Sources, api.ObservabilityAlertsMetaSourcesPrometheusAlertState)
	}
	if snap.routing != nil {
		out.Meta.Sources = append(out.Meta.Sources, api.ObservabilityAlertsMetaSourcesOncallRoster)
	}
	if s.Drills != nil {
		out.Meta.Sources = append(out.Meta.Sources, api.ObservabilityAlertsMetaSourcesAlertDrillEvidence)
	}

	ov := &out.Overall
	ov.EnvironmentProfile, ov.GeneratedAt = s.Config.Profile, snap.now
	blocked, degraded := false, snap.amErr != nil
	teams := map[string]int{}
	more := false
	for _, r := range s.Manifest.Alerts { // sorted by name
		it := s.alertItem(r, snap)
		switch it.State {
		case api.ObservabilityAlertStateFiring:
			ov.FiringCount++
			if it.Severity == api.ObservabilityAlertSeverityCritical || it.Severity == api.ObservabilityAlertSeveritySev1 {
				blocked = true
			} else {
				degraded = true
			}
		case api.ObservabilityAlertStateNotLoaded:
			blocked = true
		}
		if routeKnown(it) && !it.Route.Configured {
			ov.MissingRouteCount++
			blocked = true
		}
		switch it.Drill.State {
		case api.ObservabilityAlertDrillStateMissing, api.ObservabilityAlertDrillStateStale:
			ov.StaleDrillCount++
			blocked = true
		case api.ObservabilityAlertDrillStatePending:
			degraded = true
		}

		if !q.matches(it) {
			continue
		}
		s.rollUp(&out.Rollups, teams, it)
		if it.AlertName <= after {
			continue
		}
		if len(out.Items) == pageSize {
			more = true
			continue
		}
		out.Items = append(out.Items, it)
	}
	switch {
	case snap.promErr != nil:
		ov.Status = api.ObservabilityOverallStatusUnknown
	case blocked:
		ov.Status = api.ObservabilityOverallStatusBlocked
	case degraded:
		ov.Status = api.ObservabilityOverallStatusDegraded
	default:
		ov.Status = api.ObservabilityOverallStatusHealthy
	}
	for team, n := range teams {
		out.Rollups.ByOwnerTeam = append(out.Rollups.ByOwnerTeam, api.ObservabilityTeamCount{OwnerTeam: team, Count: n})
	}
	sort.Slice(out.Rollups.ByOwnerTeam, func(i, j int) bool {
		return out.Rollups.ByOwnerTeam[i].OwnerTeam < out.Rollups.ByOwnerTeam[j].OwnerTeam
	})
	return out, more
}

func (q AlertsQuery) matches(it api.ObservabilityAlert) bool {
	switch {
	case !q.IncludeInactive && it.State == api.ObservabilityAlertStateResolved && q.State != string(api.ObservabilityAlertStateResolved):
		return false
	case q.Severity != "" && string(it.Severity) != q.Severity,
		q.State != "" && string(it.State) != q.State,
		q.OwnerTeam != "" && it.OwnerTeam != q.OwnerTeam,
		q.Service != "" && it.Service != q.Service,
		q.Domain != "" && it.Domain != q.Domain,
		q.Runbook != "" && it.RunbookID != q.Runbook:
		return false
	}
	return true
}

func (s *Service) rollUp(r *api.ObservabilityAlertRollups, teams map[string]int, it api.ObservabilityAlert) {
	switch it.Severity {
	case api.ObservabilityAlertSeveritySev1:
		r.BySeverity.Sev1++
	case api.ObservabilityAlertSeveritySev2:
		r.BySeverity.Sev2++
	case api.ObservabilityAlertSeveritySev3:
		r.BySeverity.Sev3++
	case api.ObservabilityAlertSeverityWarning:
		r.BySeverity.Warning++
	case api.ObservabilityAlertSeverityCritical:
		r.BySeverity.Critical++
	default:
		r.BySeverity.Unknown++
	}
	teams[it.OwnerTeam]++
	switch {
	case !routeKnown(it):
		r.RouteState.Unknown++
	case it.Route.Configured:
		r.RouteState.Configured++
	default:
		r.RouteState.Missing++
	}
}
