package observability_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/observability"
)

// A drill goes from the API through the real Alertmanager, by the route of the alert it
// stands in for, to the control plane's own receiver, which records its arrival; the
// alerts read model then shows the routes drilled. The receiver refuses a wrong token.
func TestDrillArrivesThroughAlertmanager(t *testing.T) {
	amAddr, promAddr := freePort(t), freePort(t)
	tokenFile := filepath.Join(t.TempDir(), "receiver.token")
	must(t, os.WriteFile(tokenFile, []byte("receiver-token-of-the-test"), 0o600))
	env := apitest.New(t, apitest.WithConfig(func(c *app.Config) {
		c.Observability = observability.Config{PrometheusURL: "http://" + promAddr, AlertmanagerURL: "http://" + amAddr, Profile: "dev", ReceiverTokenFile: tokenFile}
	}))
	startStackWith(t, stackOptions{amAddr: amAddr, promAddr: promAddr, receiverTokenFile: tokenFile,
		receiverURL: env.Server.URL + "/api/v1/internal/alerts/receiver"})

	_, admin := env.PlatformAdmin(t)
	tenant := env.NewTenant(t, admin, "acme")
	generic := env.Call(t, "POST", obsBase+"drills", admin, map[string]any{}, "")
	pager := env.Call(t, "POST", obsBase+"drills", admin, map[string]any{"alert_name": "GantryComponentDown"}, "")
	for _, a := range []apitest.Answer{generic, pager} {
		if a.Status != 202 || a.Str("state") != "pending" || a.Body["arrived_at"] != nil {
			t.Fatalf("drill: %d %s", a.Status, a.Raw)
		}
	}
	if a := env.Call(t, "POST", obsBase+"drills", admin, map[string]any{"alert_name": "NoSuchAlert"}, ""); a.Status != 422 || a.Code() != "validation_error" {
		t.Errorf("unknown alert: %d %s", a.Status, a.Raw)
	}
	if a := env.Call(t, "POST", obsBase+"drills", tenant.AdminToken, map[string]any{}, ""); a.Status != 403 {
		t.Errorf("tenant admin: %d %s", a.Status, a.Raw)
	}
	if n := env.Count(t, `SELECT count(*) FROM observability_drills`); n != 2 {
		t.Errorf("%d drills recorded, want 2 (refused ones persist nothing)", n)
	}

	waitFor(t, 60*time.Second, "both drills arrived", func() bool {
		return env.Count(t, `SELECT count(*) FROM observability_drills WHERE arrived_at IS NOT NULL`) == 2
	})
	if n := env.Count(t, `SELECT count(*) FROM observability_drills WHERE receiver = 'platform-pager' AND alert_name = 'GantryComponentDown'`); n != 1 {
		t.Errorf("the GantryComponentDown drill did not take the pager route")
	}
	if n := env.Count(t, `SELECT count(*) FROM audit_events WHERE action IN ('observability.drill.fire', 'observability.drill.arrive')`); n != 4 {
		t.Errorf("%d drill audit rows, want 4", n)
	}

	a := env.Call(t, "GET", obsBase+"alerts?include_inactive=true&page_size=200", admin, nil, "")
	items, _ := a.Body["items"].([]any)
	for _, raw := range items {
		it := raw.(map[string]any)
		drill := it["drill"].(map[string]any)
		if drill["state"] != "current" || drill["last_drill_at"] == nil {
			t.Errorf("%s (route %v): drill %v", it["alert_name"], it["route"], drill)
		}
	}
	if ov := a.Body["overall"].(map[string]any); ov["stale_drill_count"] != float64(0) {
		t.Errorf("overall after drills: %v", ov)
	}

	for _, tok := range []string{"", "wrong"} {
		req := env.Request("POST", "/api/v1/internal/alerts/receiver", tok, `{"receiver":"platform-oncall","status":"firing","alerts":[]}`)
		if a := env.Send(t, req); a.Status != 401 || a.Code() == "" {
			t.Errorf("receiver with token %q: %d %s", tok, a.Status, a.Raw)
		}
	}
	if body := mustJSON(t, a.Body); strings.Contains(body, "receiver-token-of-the-test") || strings.Contains(body, env.Server.URL) {
		t.Errorf("alerts answer leaks the receiver: %.300s", body)
	}
}
