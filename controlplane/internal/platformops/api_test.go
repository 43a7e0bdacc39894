package platformops_test

import (
	"context"
	"io/fs"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/platformops"
	"github.com/gantry-gpu/gantry/deploy"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// Every signal names a runbook kept in the repository (deploy/runbooks/<id>.md).
func TestSignalRunbooksExist(t *testing.T) {
	for _, d := range platformops.Definitions {
		if _, err := fs.Stat(deploy.Monitoring, "runbooks/"+d.RunbookID+".md"); err != nil {
			t.Errorf("signal %s: runbook %s: %v", d.Key, d.RunbookID, err)
		}
	}
}

func sqlExec(t *testing.T, e *apitest.Env, q string, args ...any) {
	t.Helper()
	if _, err := e.Pool.Exec(context.Background(), q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func signals(t *testing.T, a apitest.Answer) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, s := range a.Body["signals"].([]any) {
		m := s.(map[string]any)
		out[m["signal_key"].(string)] = m
	}
	return out
}

func TestPlatformOpsSignalsOverviewAndReleases(t *testing.T) {
	e := apitest.New(t)
	_, padmin := e.PlatformAdmin(t)
	acme := e.NewTenant(t, padmin, "Acme")
	now := e.App.Clock.Now()

	// Nobody without platform.ops.read reads them.
	for _, path := range []string{"/api/v1/v3/platform/ops", "/api/v1/v3/platform/ops/signals/nodes_offline", "/api/v1/platform/releases"} {
		if a := e.Call(t, http.MethodGet, path, acme.AdminToken, nil, ""); a.Status != http.StatusForbidden || a.Code() != "insufficient_permissions" {
			t.Errorf("%s as a tenant admin: %d %s", path, a.Status, a.Raw)
		}
	}
	if a := e.Call(t, http.MethodGet, "/api/v1/admin/ops/overview", acme.AdminToken, nil, ""); a.Status != http.StatusForbidden || a.Code() != "admin_required" {
		t.Errorf("overview as a tenant admin: %d %s", a.Status, a.Raw)
	}

	// A quiet platform: every database signal ok, the metrics one unknown (no Prometheus).
	a := e.Call(t, http.MethodGet, "/api/v1/v3/platform/ops", padmin, nil, "")
	if a.Status != http.StatusOK {
		t.Fatalf("%d %s", a.Status, a.Raw)
	}
	sig := signals(t, a)
	if len(sig) != len(platformops.Definitions) {
		t.Fatalf("%d signals, want %d", len(sig), len(platformops.Definitions))
	}
	for k, s := range sig {
		want := "ok"
		if k == "log_gateway_rejections" {
			want = "unknown"
		}
		if s["severity"] != want {
			t.Errorf("quiet %s: severity %v, want %s", k, s["severity"], want)
		}
	}
	if ov := a.Body["overall"].(map[string]any); ov["status"] != "degraded" || ov["active_signals"] != 0.0 {
		t.Errorf("quiet overall: %v (an unknown signal degrades, never healthy by guess)", ov)
	}

	// Trouble: a stuck launch, a release failure, an offline node with an unhealthy GPU,
	// a blocked wallet; two agent versions in the fleet.
	node1, node2 := uuid.New(), uuid.New()
	sqlExec(t, e, `INSERT INTO nodes (id, name, address, probe_port, status, status_changed_at, enrolled_at, agent_version, created_at, updated_at)
		VALUES ($1, 'gpu-a', '10.0.0.1', 7000, 'offline', $3, $3, '1.4.0', $3, $3), ($2, 'gpu-b', '10.0.0.2', 7000, 'online', $3, $3, '1.5.0', $3, $3)`, node1, node2, now)
	sqlExec(t, e, `INSERT INTO node_gpus (node_id, gpu_uuid, gpu_index, model, memory_bytes, pci_bus_id, mig_enabled, driver_version, cuda_version, healthy)
		VALUES ($1, 'GPU-1', 0, 'H100', 1, '0000:01:00.0', false, '550', '12.4', false), ($2, 'GPU-2', 0, 'H100', 1, '0000:01:00.0', false, '550', '12.4', true)`, node1, node2)
	for _, st := range []struct {
		status string
		age    time.Duration
	}{{"provisioning", time.Hour}, {"requested", time.Minute}, {"release_failed", 2 * time.Hour}} {
		sqlExec(t, e, `INSERT INTO allocations (id, tenant_id, project_id, owner_user_id, name, sku, gpu_model, gpu_count, usage_unit, region_code,
			node_id, ssh_key_ids, ssh_public_keys, status, created_at, updated_at)
			VALUES ($1, $2, $3, $4, 'secret-project-name', 'h100.1x', 'H100', 1, 'gpu.h100', 'eu-west-1', $5, '{}', '{}', $6, $7, $7)`,
			uuid.New(), acme.ID, acme.DefaultProject, acme.AdminID, node2, st.status, now.Add(-st.age))
	}
	sqlExec(t, e, `INSERT INTO billing_runway_blocks (tenant_id, currency, blocked_at, burn_per_second) VALUES ($1, 'USD', $2, '0.01')`, acme.ID, now)

	a = e.Call(t, http.MethodGet, "/api/v1/v3/platform/ops", padmin, nil, "")
	sig = signals(t, a)
	for k, want := range map[string]struct {
		severity string
		count    float64
		runbook  string
	}{
		"stuck_provisioning": {"critical", 1, "ops.provisioning.stuck"}, // the requested one is within the timeout
		"release_failures":   {"critical", 1, "ops.allocations.release_failed"},
		"nodes_offline":      {"warning", 1, "ops.nodes.offline"},
		"gpus_unhealthy":     {"warning", 1, "ops.gpus.unhealthy"},
		"runway_exhaustion":  {"warning", 1, "ops.billing.runway"},
	} {
		s := sig[k]
		if s["severity"] != want.severity || s["count"] != want.count || s["runbook_id"] != want.runbook {
			t.Errorf("%s: %v, want %+v", k, s, want)
		}
		ev := s["evidence"].([]any)
		if len(ev) != 1 || ev[0].(map[string]any)["value"] != want.count {
			t.Errorf("%s evidence: %v", k, ev)
		}
	}
	if ov := a.Body["overall"].(map[string]any); ov["status"] != "unhealthy" || ov["active_signals"] != 5.0 {
		t.Errorf("overall: %v", ov)
	}

	// The detail lists the subjects, ids and classifications only.
	a = e.Call(t, http.MethodGet, "/api/v1/v3/platform/ops/signals/nodes_offline", padmin, nil, "")
	subs := a.Body["subjects"].([]any)
	if a.Status != http.StatusOK || len(subs) != 1 || subs[0].(map[string]any)["id"] != node1.String() || subs[0].(map[string]any)["label"] != "gpu-a" {
		t.Fatalf("nodes_offline detail: %d %s", a.Status, a.Raw)
	}
	a = e.Call(t, http.MethodGet, "/api/v1/v3/platform/ops/signals/release_failures", padmin, nil, "")
	if a.Status != http.StatusOK || len(a.Body["subjects"].([]any)) != 1 || strings.Contains(a.Raw, "secret-project-name") {
		t.Fatalf("release_failures detail (no tenant content): %d %s", a.Status, a.Raw)
	}
	if a = e.Call(t, http.MethodGet, "/api/v1/v3/platform/ops/signals/made_up", padmin, nil, ""); a.Status != http.StatusUnprocessableEntity || a.Code() != "validation_error" {
		t.Fatalf("unknown signal: %d %s", a.Status, a.Raw)
	}

	// The overview's control_plane block counts this replica's platform-role requests.
	if a = e.Call(t, http.MethodGet, "/api/v1/admin/platform-roles", padmin, nil, ""); a.Status != http.StatusOK {
		t.Fatalf("list platform roles: %d %s", a.Status, a.Raw)
	}
	a = e.Call(t, http.MethodGet, "/api/v1/admin/ops/overview", padmin, nil, "")
	if a.Status != http.StatusOK {
		t.Fatalf("overview: %d %s", a.Status, a.Raw)
	}
	cp := a.Body["control_plane"].(map[string]any)
	if cp["platform_role_list_requests_total"].(float64) < 1 || cp["replica_id"] == "" {
		t.Errorf("control_plane: %v", cp)
	}
	fleet := a.Body["fleet"].(map[string]any)
	if fleet["nodes_total"] != 2.0 || fleet["nodes_offline"] != 1.0 || fleet["gpus_unhealthy"] != 1.0 {
		t.Errorf("fleet: %v", fleet)
	}
	if al := a.Body["allocations"].(map[string]any); al["release_failed"] != 1.0 || al["provisioning"] != 2.0 || al["live"] != 3.0 {
		t.Errorf("allocations: %v", al)
	}
	if sg := a.Body["signals"].(map[string]any); sg["critical"] != 2.0 || sg["warning"] != 3.0 {
		t.Errorf("signals: %v", sg)
	}

	// Releases: the control plane's own build, and a mixed-version fleet.
	a = e.Call(t, http.MethodGet, "/api/v1/platform/releases", padmin, nil, "")
	if a.Status != http.StatusOK || a.Body["mixed_agent_versions"] != true || a.Body["contract_version"] != "1.0.0-draft" {
		t.Fatalf("releases: %d %s", a.Status, a.Raw)
	}
	av := a.Body["agent_versions"].([]any)
	if len(av) != 2 {
		t.Fatalf("agent versions: %v", av)
	}
	comps := map[string]map[string]any{}
	for _, c := range a.Body["components"].([]any) {
		comps[c.(map[string]any)["component"].(string)] = c.(map[string]any)
	}
	// No Prometheus is configured here, so the log gateway's build is unknown (null
	// version), never guessed; TestLogGatewaySignalFromPrometheus reads it for real.
	if comps["controlplane"]["source"] != "self" || comps["controlplane"]["version"] == nil || comps["loggateway"]["source"] != "unknown" ||
		comps["loggateway"]["version"] != nil || comps["nodeagent"]["source"] != "reported" {
		t.Errorf("components: %v", comps)
	}
}
