package observability_test

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/observability"
)

const obsBase = "/api/v1/v3/platform/ops/observability/"

// Every operation of the package through the real server (every answer validated
// against the contract by apitest), against a real Prometheus and Alertmanager:
// answers, filters, pages, bad input (validation_error is 422 by the house mapping,
// ARCHITECTURE §3) and authorization.
func TestObservabilityOperationsOverHTTP(t *testing.T) {
	st := startStack(t)
	env := apitest.New(t, apitest.WithConfig(func(c *app.Config) {
		c.Observability = observability.Config{PrometheusURL: st.PromURL, AlertmanagerURL: st.AMURL, Profile: "dev"}
	}))
	_, admin := env.PlatformAdmin(t)
	tenant := env.NewTenant(t, admin, "acme")

	ok := func(path string) apitest.Answer {
		t.Helper()
		a := env.Call(t, "GET", path, admin, nil, "")
		if a.Status != 200 {
			t.Fatalf("GET %s: %d %s", path, a.Status, a.Raw)
		}
		return a
	}
	a := ok(obsBase + "alerts?include_inactive=true&page_size=3")
	items, _ := a.Body["items"].([]any)
	pg, _ := a.Body["pagination"].(map[string]any)
	next, _ := pg["next_cursor"].(string)
	if len(items) != 3 || next == "" {
		t.Fatalf("first page: %d items, next %q", len(items), next)
	}
	a2 := ok(obsBase + "alerts?include_inactive=true&page_size=3&cursor=" + url.QueryEscape(next))
	items2, _ := a2.Body["items"].([]any)
	if first, second := items[2].(map[string]any)["alert_name"].(string), items2[0].(map[string]any)["alert_name"].(string); second <= first {
		t.Errorf("second page starts at %s after %s", second, first)
	}
	for _, q := range []string{"", "?severity=critical&state=resolved&include_inactive=true", "?owner_team=platform&service=gantry-controlplane&domain=api&runbook_id=ops.api.latency&include_inactive=true",
		"?environment_profile=dev&state=not_loaded"} {
		ok(obsBase + "alerts" + q)
	}
	for _, q := range []string{"", "?time_range=1h", "?time_range=7d&service=api&slo_id=api-latency&release_id=r-2026.11.25&include_query_outcomes=false&page_size=100",
		"?time_range=custom&from=" + url.QueryEscape(time.Now().Add(-2*time.Hour).Format(time.RFC3339)) + "&to=" + url.QueryEscape(time.Now().Format(time.RFC3339))} {
		ok(obsBase + "slo-evidence" + q)
	}
	for _, q := range []string{"", "?component_type=api", "?status=unhealthy&include_evidence=false&include_prometheus_queries=true"} {
		ok(obsBase + "health-snapshot" + q)
	}
	h := ok(obsBase + "health-snapshot")
	if ov, _ := h.Body["overall"].(map[string]any); ov["environment_profile"] != "dev" {
		t.Errorf("health overall: %v", ov)
	}

	rb := ok("/api/v1/admin/runbooks?page_size=200")
	rbs, _ := rb.Body["items"].([]any)
	if len(rbs) != len(observability.DeployManifest().Runbooks) {
		t.Errorf("%d runbooks listed", len(rbs))
	}
	one := ok("/api/v1/admin/runbooks/ops.provisioning.stuck")
	if !strings.Contains(one.Str("body_markdown"), "Provisioning queue stuck") || one.Str("severity") != "critical" || one.Str("href") != "/api/v1/admin/runbooks/ops.provisioning.stuck" ||
		one.Str("last_reviewed") != "2026-11-25" || one.Str("service") != "gantry-controlplane" || one.Str("summary") == "" ||
		len(one.Body["alerts"].([]any)) != 4 || one.Body["signals"].([]any)[0] != "stuck_provisioning" {
		t.Errorf("runbook: %s", one.Raw)
	}

	for _, c := range []struct {
		path, code, field string
		status            int
	}{
		{obsBase + "alerts?severity=sev9", "validation_error", "severity", 422},
		{obsBase + "alerts?state=exploded", "validation_error", "state", 422},
		{obsBase + "alerts?page_size=201", "validation_error", "page_size", 422},
		{obsBase + "alerts?page_size=0", "validation_error", "page_size", 422},
		{obsBase + "alerts?environment_profile=prod", "validation_error", "environment_profile", 422},
		{obsBase + "alerts?cursor=forged.cursor", "invalid_request", "cursor", 400},
		{obsBase + "slo-evidence?time_range=2h", "validation_error", "time_range", 422},
		{obsBase + "slo-evidence?time_range=custom", "validation_error", "from", 422},
		{obsBase + "slo-evidence?time_range=custom&from=2026-11-25T10:00:00Z", "validation_error", "to", 422},
		{obsBase + "slo-evidence?time_range=custom&from=2026-11-25T10:00:00Z&to=2026-11-25T10:00:00Z", "validation_error", "from", 422},
		{obsBase + "slo-evidence?time_range=custom&from=2026-11-25T11:00:00Z&to=2026-11-25T10:00:00Z", "validation_error", "from", 422},
		{obsBase + "slo-evidence?time_range=1h&to=2026-11-25T10:00:00Z", "validation_error", "to", 422},
		{obsBase + "slo-evidence?page_size=101", "validation_error", "page_size", 422},
		{obsBase + "health-snapshot?component_type=mainframe", "validation_error", "component_type", 422},
		{obsBase + "health-snapshot?status=fine", "validation_error", "status", 422},
		{"/api/v1/admin/runbooks/ops.no.such", "invalid_request", "runbook_id", 404},
	} {
		a := env.Call(t, "GET", c.path, admin, nil, "")
		field, _ := a.Body["details"].(map[string]any)["field"].(string)
		if a.Status != c.status || a.Code() != c.code || field != c.field {
			t.Errorf("GET %s: %d %s field %q, want %d %s %q (%s)", c.path, a.Status, a.Code(), field, c.status, c.code, c.field, a.Raw)
		}
	}

	// A tenant admin holds no platform capability.
	for _, p := range []string{obsBase + "alerts", obsBase + "slo-evidence", obsBase + "health-snapshot", "/api/v1/admin/runbooks", "/api/v1/admin/runbooks/ops.api.latency"} {
		if a := env.Call(t, "GET", p, tenant.AdminToken, nil, ""); a.Status != 403 {
			t.Errorf("tenant admin GET %s: %d %s", p, a.Status, a.Raw)
		}
	}
	if env.Validated.Load() < 30 {
		t.Errorf("only %d responses validated against the contract", env.Validated.Load())
	}
}
