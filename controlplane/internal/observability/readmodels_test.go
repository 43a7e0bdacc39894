package observability_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-gpu/gantry/controlplane/internal/observability"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/clock"
)

func service(t *testing.T, promURL, amURL string) *observability.Service {
	t.Helper()
	svc, err := observability.NewService(observability.DeployManifest(),
		observability.Config{PrometheusURL: promURL, AlertmanagerURL: amURL, Profile: "test"}, clock.Real{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Components = observability.ComponentProbes{
		Database: func(context.Context) error { return nil },
		EventBus: func(context.Context) error { return errors.New("nats disconnected") },
		Gateway:  func(context.Context) error { return nil },
	}
	return svc
}

func alertByName(items []api.ObservabilityAlert, name string) (api.ObservabilityAlert, bool) {
	for _, it := range items {
		if it.AlertName == name {
			return it, true
		}
	}
	return api.ObservabilityAlert{}, false
}

func componentByID(cs []api.ObservabilityComponent, id string) api.ObservabilityComponent {
	for _, c := range cs {
		if c.ComponentID == id {
			return c
		}
	}
	return api.ObservabilityComponent{}
}

// The three read models against a real Prometheus (the repository's rules, but the
// provisioning ones left out) and Alertmanager (the repository's routes): an alert
// fires for real, is delivered through its route, is then silenced; SLIs come from the
// recording rules; the log gateway's target is down.
func TestReadModelsAgainstRealPrometheusAndAlertmanager(t *testing.T) {
	st := startStack(t, "gantry-provisioning.rules.yml")
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "api_http_requests_total", Help: "h"}, []string{"route", "method", "code"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "api_http_request_duration_seconds", Help: "h",
		Buckets: []float64{.1, .5, 1}}, []string{"route", "method"})
	dropped := prometheus.NewCounter(prometheus.CounterOpts{Name: "audit_denial_rows_dropped_total", Help: "h"})
	st.CP.MustRegister(requests, duration, dropped)

	// Traffic: one request in twenty fails (availability 0.95: the budget of 99.5% is
	// exhausted, yet below the fast-burn rate, so no burn alert fires while the test
	// runs), all within 500 ms.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		for tick := time.NewTicker(50 * time.Millisecond); ; {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				requests.WithLabelValues("/api/v1/allocations", "GET", "200").Add(19)
				requests.WithLabelValues("/api/v1/allocations", "GET", "500").Add(1)
				for range 20 {
					duration.WithLabelValues("/api/v1/allocations", "GET").Observe(0.05)
				}
			}
		}
	}()
	svc := service(t, st.PromURL, st.AMURL)
	all := observability.AlertsQuery{IncludeInactive: true}

	// The dropped-denials counter is scraped at 0, then grows: the alert (for: 0m) fires.
	waitFor(t, 60*time.Second, "a first scrape", func() bool {
		out := svc.HealthSnapshot(ctx, observability.HealthQuery{})
		return componentByID(out.Components, "api").Metrics.ScrapeState == api.ObservabilityComponentMetricsScrapeStateUp
	})
	time.Sleep(2 * time.Second)
	dropped.Add(3)
	var alerts api.ObservabilityAlertsResponse
	waitFor(t, 60*time.Second, "AuditDenialRowsDropped firing", func() bool {
		alerts, _ = svc.Alerts(ctx, all, "", 200)
		it, _ := alertByName(alerts.Items, "AuditDenialRowsDropped")
		return it.State == api.ObservabilityAlertStateFiring
	})
	m := observability.DeployManifest()
	if len(alerts.Items) != len(m.Alerts) {
		t.Fatalf("%d items, manifest has %d alerts", len(alerts.Items), len(m.Alerts))
	}
	fired, _ := alertByName(alerts.Items, "AuditDenialRowsDropped")
	if fired.Severity != api.ObservabilityAlertSeverityWarning || fired.RunbookID != "ops.audit.denials_dropped" ||
		fired.RunbookHref != "/api/v1/admin/runbooks/ops.audit.denials_dropped" || fired.LastFiredAt == nil ||
		fired.Route.Destination != "platform-oncall" || !fired.Route.Configured || fired.Route.LastVerifiedAt == nil ||
		fired.Drill.State != api.ObservabilityAlertDrillStateMissing || fired.OwnerTeam != "platform" || fired.Domain != "audit" {
		t.Errorf("fired alert: %+v", fired)
	}
	if it, _ := alertByName(alerts.Items, "ProvisioningQueueStuck"); it.State != api.ObservabilityAlertStateNotLoaded {
		t.Errorf("ProvisioningQueueStuck (rules file not loaded): state %s", it.State)
	}
	if it, _ := alertByName(alerts.Items, "GantryComponentDown"); it.State != api.ObservabilityAlertStateResolved ||
		it.Route.Destination != "platform-pager" || !it.Route.Configured {
		t.Errorf("GantryComponentDown (loaded, pending for 2m): %+v", it)
	}
	ov := alerts.Overall
	if ov.Status != api.ObservabilityOverallStatusBlocked || ov.FiringCount != 1 || ov.MissingRouteCount != 0 ||
		ov.StaleDrillCount != len(m.Alerts) || ov.EnvironmentProfile != "test" {
		t.Errorf("overall: %+v", ov)
	}
	if r := alerts.Rollups; r.RouteState.Configured != len(m.Alerts) || r.BySeverity.Critical+r.BySeverity.Warning != len(m.Alerts) ||
		len(r.ByOwnerTeam) != 1 || r.ByOwnerTeam[0].Count != len(m.Alerts) {
		t.Errorf("rollups: %+v", r)
	}
	if !slices.Contains(alerts.Meta.Sources, api.ObservabilityAlertsMetaSourcesPrometheusAlertState) ||
		!slices.Contains(alerts.Meta.Sources, api.ObservabilityAlertsMetaSourcesOncallRoster) || alerts.Meta.RawPrometheusSamplesIncluded {
		t.Errorf("meta: %+v", alerts.Meta)
	}
	// Without include_inactive only the firing and the not-loaded alerts are listed.
	active, _ := svc.Alerts(ctx, observability.AlertsQuery{}, "", 200)
	for _, it := range active.Items {
		if it.State == api.ObservabilityAlertStateResolved {
			t.Errorf("include_inactive=false listed %s (%s)", it.AlertName, it.State)
		}
	}
	if len(active.Items) != 1+4 {
		t.Errorf("include_inactive=false: %d items, want the firing one and 4 not loaded", len(active.Items))
	}
	// Filters and pages.
	crit, _ := svc.Alerts(ctx, observability.AlertsQuery{IncludeInactive: true, Severity: "critical"}, "", 200)
	for _, it := range crit.Items {
		if it.Severity != api.ObservabilityAlertSeverityCritical {
			t.Errorf("severity=critical listed %s (%s)", it.AlertName, it.Severity)
		}
	}
	if crit.Rollups.BySeverity.Warning != 0 || crit.Rollups.BySeverity.Critical != len(crit.Items) || len(crit.Items) == 0 {
		t.Errorf("severity=critical rollups %+v for %d items", crit.Rollups.BySeverity, len(crit.Items))
	}
	page1, more := svc.Alerts(ctx, all, "", 5)
	page2, _ := svc.Alerts(ctx, all, page1.Items[4].AlertName, 5)
	if !more || len(page1.Items) != 5 || page2.Items[0].AlertName <= page1.Items[4].AlertName {
		t.Errorf("pages: %d items more=%v, then %s", len(page1.Items), more, page2.Items[0].AlertName)
	}

	// Alertmanager delivered it through the platform-oncall route to the receiver.
	waitFor(t, 60*time.Second, "the alert delivered to the receiver", func() bool {
		for _, p := range st.Received() {
			if p["receiver"] == "platform-oncall" && strings.Contains(mustJSON(t, p), `"alertname":"AuditDenialRowsDropped"`) {
				return true
			}
		}
		return false
	})

	// SLO evidence over the last hour.
	to := time.Now().UTC()
	q := observability.SLOQuery{RangeName: "1h", From: to.Add(-time.Hour), To: to, IncludeQueryOutcomes: true}
	var slo api.ObservabilitySloEvidenceResponse
	waitFor(t, 60*time.Second, "the availability SLI recorded", func() bool {
		q.To = time.Now().UTC()
		slo, _ = svc.SLOEvidence(ctx, q, "", 25)
		for _, it := range slo.Items {
			if it.SloID == "api-availability" {
				return it.QueryOutcome.State == api.ObservabilitySloQueryOutcomeStateFresh
			}
		}
		return false
	})
	for _, it := range slo.Items {
		switch it.SloID {
		case "api-availability":
			v, err := strconv.ParseFloat(it.Current.Value, 64)
			if err != nil || v < 0.93 || v > 0.97 || it.Current.Status != api.ObservabilitySloCurrentStatusExhausted ||
				it.Current.ErrorBudgetRemainingPercent != 0 || it.Objective.Target != "0.995" || !it.AlertCoverage.Loaded || !it.AlertCoverage.RouteConfigured {
				t.Errorf("api-availability: %+v", it)
			}
		case "api-latency":
			if it.Current.Value != "1.00000" || it.Current.Status != api.ObservabilitySloCurrentStatusWithinBudget || it.Current.ErrorBudgetRemainingPercent != 100 {
				t.Errorf("api-latency: %+v", it)
			}
		case "loggateway-acceptance":
			if it.QueryOutcome.State != api.ObservabilitySloQueryOutcomeStateStale || it.Current.Status != api.ObservabilitySloCurrentStatusUnknown {
				t.Errorf("loggateway-acceptance (no traffic): %+v", it)
			}
		case "provisioning-time":
			if it.AlertCoverage.Loaded {
				t.Errorf("provisioning-time: required ProvisioningQueueStuck is not loaded: %+v", it.AlertCoverage)
			}
		}
	}
	gate := slo.ReleaseGate
	for _, want := range []string{"api-availability: error budget exhausted", "provisioning-time: required alert ProvisioningQueueStuck not loaded in Prometheus",
		"loggateway-acceptance: no SLI samples in the window", "api-latency: drill of route platform-oncall missing"} {
		if !slices.Contains(gate.BlockingReasons, want) {
			t.Errorf("release gate lacks %q: %v", want, gate.BlockingReasons)
		}
	}
	if gate.State != api.ObservabilityReleaseGateStateBlocked || slo.Overall.Status != api.ObservabilityOverallStatusBlocked || len(slo.Items) != 4 {
		t.Errorf("slo overall %+v gate %+v", slo.Overall, gate)
	}

	// Health snapshot.
	var health api.ObservabilityHealthSnapshotResponse
	waitFor(t, 30*time.Second, "the log gateway scraped down", func() bool {
		health = svc.HealthSnapshot(ctx, observability.HealthQuery{IncludeEvidence: true, IncludePQ: true})
		return componentByID(health.Components, "node-log-gateway").Metrics.ScrapeState == api.ObservabilityComponentMetricsScrapeStateDown
	})
	if c := componentByID(health.Components, "node-log-gateway"); c.Status != api.ObservabilityComponentStatusUnhealthy ||
		c.Details.HealthzStatus != api.ObservabilityComponentDetailsHealthzStatusFailing || c.DegradationReason == nil {
		t.Errorf("node-log-gateway: %+v", c)
	}
	if c := componentByID(health.Components, "api"); c.Status != api.ObservabilityComponentStatusDegraded ||
		c.Metrics.ErrorRateClass != api.ObservabilityComponentMetricsErrorRateClassElevated || c.Metrics.LatencyClass != api.ObservabilityComponentMetricsLatencyClassNormal {
		t.Errorf("api (5%% errors): %+v", c)
	}
	if c := componentByID(health.Components, "nats"); c.Status != api.ObservabilityComponentStatusUnhealthy {
		t.Errorf("nats (probe failing): %+v", c)
	}
	if c := componentByID(health.Components, "redis"); c.Status != api.ObservabilityComponentStatusNotReported {
		t.Errorf("redis (not configured): %+v", c)
	}
	if c := componentByID(health.Components, "prometheus-alertmanager"); c.Status != api.ObservabilityComponentStatusHealthy {
		t.Errorf("observability: %+v", c)
	}
	if health.Overall.Status != api.ObservabilityComponentStatusUnhealthy || !health.Rollups.Observability.PrometheusReachable ||
		!strings.Contains(health.Overall.Summary, "node-log-gateway unhealthy") || len(health.Components) != 10 {
		t.Errorf("health overall %+v rollups %+v", health.Overall, health.Rollups)
	}

	// A silence turns the firing alert into suppressed.
	st.silence(t, "AuditDenialRowsDropped")
	waitFor(t, 60*time.Second, "AuditDenialRowsDropped suppressed", func() bool {
		out, _ := svc.Alerts(ctx, observability.AlertsQuery{State: "suppressed"}, "", 200)
		return len(out.Items) == 1 && out.Items[0].AlertName == "AuditDenialRowsDropped"
	})

	scanExcluded(t, st, alerts, active, slo, health)
}

// scanExcluded checks answers for the seed 4.2.8 exclusions that this stack could
// leak: the receiver's address and token, rule expressions and raw series.
func scanExcluded(t *testing.T, st *stack, answers ...any) {
	t.Helper()
	u, _ := url.Parse(st.ReceiverURL)
	forbidden := []string{st.ReceiverToken, u.Host, st.ReceiverURL, "credentials", "webhook", "Bearer",
		"increase(", "rate(", "sum(", "api_http_requests_total", "_bucket", "audit_denial_rows_dropped_total", "\"values\"", "\"value\":["}
	for _, a := range answers {
		body := mustJSON(t, a)
		for _, f := range forbidden {
			if strings.Contains(body, f) {
				t.Errorf("answer contains %q: %.300s", f, body)
			}
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// With Prometheus and Alertmanager unreachable (or not configured) the read models
// answer, saying what they cannot know.
func TestReadModelsWithUnreachableSources(t *testing.T) {
	for name, urls := range map[string][2]string{
		"unreachable":    {"http://" + freePort(t), "http://" + freePort(t)},
		"not configured": {"", ""},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			svc := service(t, urls[0], urls[1])
			m := observability.DeployManifest()
			alerts, _ := svc.Alerts(ctx, observability.AlertsQuery{}, "", 200)
			if alerts.Overall.Status != api.ObservabilityOverallStatusUnknown || len(alerts.Items) != len(m.Alerts) ||
				alerts.Rollups.RouteState.Unknown != len(m.Alerts) || alerts.Overall.MissingRouteCount != 0 {
				t.Errorf("alerts: overall %+v rollups %+v (%d items)", alerts.Overall, alerts.Rollups, len(alerts.Items))
			}
			for _, it := range alerts.Items {
				if it.State != api.ObservabilityAlertStateUnknown || it.Route.Configured || it.Route.LastVerifiedAt != nil || it.Route.Destination == "" {
					t.Errorf("%s: %+v", it.AlertName, it)
				}
			}
			if slices.Contains(alerts.Meta.Sources, api.ObservabilityAlertsMetaSourcesPrometheusAlertState) {
				t.Errorf("sources claim prometheus: %v", alerts.Meta.Sources)
			}
			slo, _ := svc.SLOEvidence(ctx, observability.SLOQuery{RangeName: "30d", From: time.Now().Add(-720 * time.Hour), To: time.Now()}, "", 25)
			if slo.ReleaseGate.State != api.ObservabilityReleaseGateStateUnknown || slo.Overall.Status != api.ObservabilityOverallStatusUnknown || len(slo.Items) != 4 {
				t.Errorf("slo: %+v %+v", slo.Overall, slo.ReleaseGate)
			}
			for _, it := range slo.Items {
				if it.QueryOutcome.State != api.ObservabilitySloQueryOutcomeStateFailed || it.Current.Status != api.ObservabilitySloCurrentStatusUnknown {
					t.Errorf("%s: %+v", it.SloID, it)
				}
			}
			h := svc.HealthSnapshot(ctx, observability.HealthQuery{IncludeEvidence: true})
			if h.Rollups.Observability.PrometheusReachable || h.Overall.Status != api.ObservabilityComponentStatusUnhealthy {
				t.Errorf("health: %+v %+v", h.Overall, h.Rollups.Observability)
			}
			if c := componentByID(h.Components, "api"); c.Status != api.ObservabilityComponentStatusUnknown ||
				c.Metrics.ScrapeState != api.ObservabilityComponentMetricsScrapeStateUnknown {
				t.Errorf("api: %+v", c)
			}
			if c := componentByID(h.Components, "postgresql"); c.Status != api.ObservabilityComponentStatusHealthy {
				t.Errorf("postgresql (probe ok): %+v", c)
			}
		})
	}
}

// Seed 4.2.7: overall is the maximum severity over the required components; an
// optional component (Grafana, the cache) never makes it worse; a required component
// that is not reported cannot be classified.
func TestOverallStatusSemantics(t *testing.T) {
	const (
		H = api.ObservabilityComponentStatusHealthy
		D = api.ObservabilityComponentStatusDegraded
		U = api.ObservabilityComponentStatusUnhealthy
		K = api.ObservabilityComponentStatusUnknown
		N = api.ObservabilityComponentStatusNotReported
	)
	for _, c := range []struct {
		name     string
		statuses []api.ObservabilityComponentStatus
		required []bool
		want     api.ObservabilityComponentStatus
	}{
		{"all healthy", []api.ObservabilityComponentStatus{H, H}, []bool{true, true}, H},
		{"one degraded", []api.ObservabilityComponentStatus{H, D}, []bool{true, true}, D},
		{"unhealthy beats unknown and degraded", []api.ObservabilityComponentStatus{K, U, D}, []bool{true, true, true}, U},
		{"unknown beats degraded", []api.ObservabilityComponentStatus{D, K}, []bool{true, true}, K},
		{"optional grafana unhealthy", []api.ObservabilityComponentStatus{H, U}, []bool{true, false}, H},
		{"optional cache not reported", []api.ObservabilityComponentStatus{H, N}, []bool{true, false}, H},
		{"required not reported", []api.ObservabilityComponentStatus{H, N}, []bool{true, true}, K},
		{"optional degraded, required healthy", []api.ObservabilityComponentStatus{D, H}, []bool{false, true}, H},
		{"nothing required", []api.ObservabilityComponentStatus{U}, []bool{false}, H},
	} {
		if got := observability.Overall(c.statuses, c.required); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}
