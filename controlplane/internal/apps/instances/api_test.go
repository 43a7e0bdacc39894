package instances_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
)

func wantAnswer(t *testing.T, a apitest.Answer, status int, code, reason string) {
	t.Helper()
	if a.Status != status || (code != "" && a.Code() != code) || (reason != "" && a.Reason() != reason) {
		t.Fatalf("got %d %s/%s, want %d %s/%s: %s", a.Status, a.Code(), a.Reason(), status, code, reason, a.Raw)
	}
}

// activeAllocation stores an active allocation of project (a fixture: the launch path of
// allocations is tested there; here it only has to be there and active).
func activeAllocation(t *testing.T, e *apitest.Env, tenant, project, owner uuid.UUID, gpus int) uuid.UUID {
	t.Helper()
	id := uuid.Must(uuid.NewV7())
	if _, err := e.Pool.Exec(context.Background(), `INSERT INTO allocations (id, tenant_id, project_id, owner_user_id, name, sku, gpu_model,
		gpu_count, usage_unit, region_code, node_id, ssh_key_ids, ssh_public_keys, status, created_at, updated_at, active_at)
		VALUES ($1, $2, $3, $4, 'box', 'h100.1x', 'NVIDIA H100 80GB HBM3', $5, 'gpu.h100', 'eu-west-1', $6, '{}', '{}', 'active', now(), now(), now())`,
		id, tenant, project, owner, gpus, uuid.Must(uuid.NewV7())); err != nil {
		t.Fatal(err)
	}
	return id
}

// The app instance operations through the real server and the contract (every answer
// is validated against proto/openapi by the test client): launch, get, list with a
// cursor, stop, and the refusals with their codes and statuses, nothing persisted.
func TestAppInstancesAPI(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	_, admin := e.PlatformAdmin(t)
	acme, other := e.NewTenant(t, admin, "Acme"), e.NewTenant(t, admin, "Other")
	pa, po := acme.DefaultProject.String(), other.DefaultProject.String()
	version := func(v string, gpus int) map[string]any {
		return map[string]any{"version": v, "command": []string{"python3", "-m", "http.server", "{port}"}, "port": 8000,
			"health_check": map[string]any{"type": "http", "path": "/"}, "min_gpu_count": gpus}
	}
	wantAnswer(t, e.Call(t, "POST", "/api/v1/admin/apps", admin, map[string]any{"slug": "files", "name": "Files", "kind": "app",
		"versions": []any{version("1", 1), version("big", 4)}}, ""), 201, "", "")
	wantAnswer(t, e.Call(t, "POST", "/api/v1/admin/apps/files/entitlements", admin, map[string]any{"tenant_id": acme.ID}, ""), 201, "", "")
	alloc := activeAllocation(t, e, acme.ID, acme.DefaultProject, acme.AdminID, 2)
	otherAlloc := activeAllocation(t, e, other.ID, other.DefaultProject, other.AdminID, 2)
	body := func(slug, v string, alloc uuid.UUID) map[string]any {
		return map[string]any{"app_slug": slug, "version": v, "name": "my files", "allocation_id": alloc}
	}

	// Refusals first: nothing may be left behind by any of them.
	for _, c := range []struct {
		name           string
		token, project string
		body           any
		status         int
		code, reason   string
	}{
		{"no project", acme.AdminToken, "", body("files", "1", alloc), 400, "invalid_request", ""},
		{"neither target", acme.AdminToken, pa, map[string]any{"app_slug": "files", "version": "1", "name": "x"}, 422, "validation_error", ""},
		{"both targets", acme.AdminToken, pa, map[string]any{"app_slug": "files", "version": "1", "name": "x", "allocation_id": alloc, "sku": "h100.1x"}, 422, "validation_error", "one_of"},
		{"unknown app", acme.AdminToken, pa, body("nope", "1", alloc), 404, "app_not_found", ""},
		{"unknown version", acme.AdminToken, pa, body("files", "9", alloc), 404, "app_version_not_found", ""},
		{"not entitled", other.AdminToken, po, body("files", "1", otherAlloc), 403, "app_not_entitled", ""},
		{"another tenant's allocation", acme.AdminToken, pa, body("files", "1", otherAlloc), 404, "allocation_not_found", ""},
		{"too few GPUs", acme.AdminToken, pa, body("files", "big", alloc), 422, "validation_error", "insufficient_gpus"},
	} {
		t.Run(c.name, func(t *testing.T) {
			wantAnswer(t, e.Call(t, "POST", "/api/v1/app-instances", c.token, c.body, c.project), c.status, c.code, c.reason)
		})
	}
	if n := e.Count(t, `SELECT count(*) FROM app_instances`) + e.Count(t, `SELECT count(*) FROM audit_events WHERE action LIKE 'app_instance.%'`); n != 0 {
		t.Fatalf("refusals left %d rows", n)
	}

	// Launch: 201, requested, the contract's every field.
	created := e.Call(t, "POST", "/api/v1/app-instances", acme.AdminToken, body("files", "1", alloc), pa)
	wantAnswer(t, created, 201, "", "")
	id := created.Str("id")
	if created.Str("state") != "requested" || created.Str("proxy_path") != "/api/v1/app-proxy/"+id+"/" || created.Str("app_name") != "Files" ||
		created.Body["allocation_launched"] != false || created.Str("bootstrap_ssh") != "not_required" || created.Str("kind") != "app" {
		t.Fatalf("created: %s", created.Raw)
	}
	second := e.Call(t, "POST", "/api/v1/app-instances", acme.AdminToken, body("files", "1", alloc), pa)
	wantAnswer(t, second, 201, "", "")
	// The version's port for the first; the second takes its port from {port}, so it
	// gets the first free one of the node's range.
	if created.Body["port"] != float64(8000) || second.Body["port"] != float64(20000) {
		t.Fatalf("ports %v and %v", created.Body["port"], second.Body["port"])
	}
	got := e.Call(t, "GET", "/api/v1/app-instances/"+id, acme.AdminToken, nil, pa)
	wantAnswer(t, got, 200, "", "")
	// Another tenant's project cannot see it.
	wantAnswer(t, e.Call(t, "GET", "/api/v1/app-instances/"+id, other.AdminToken, nil, po), 404, "app_instance_not_found", "")
	// A page of one, then the rest by cursor.
	page := e.Call(t, "GET", "/api/v1/app-instances?page_size=1", acme.AdminToken, nil, pa)
	wantAnswer(t, page, 200, "", "")
	items := page.Body["items"].([]any)
	next, _ := page.Body["pagination"].(map[string]any)["next_cursor"].(string)
	if len(items) != 1 || items[0].(map[string]any)["id"] != id || next == "" {
		t.Fatalf("first page: %s", page.Raw)
	}
	rest := e.Call(t, "GET", "/api/v1/app-instances?page_size=1&cursor="+next, acme.AdminToken, nil, pa)
	wantAnswer(t, rest, 200, "", "")
	if items := rest.Body["items"].([]any); len(items) != 1 || items[0].(map[string]any)["id"] != second.Str("id") {
		t.Fatalf("second page: %s", rest.Raw)
	}

	// Stop: 202; nothing had reached a node, so it is stopped at once; again is 409.
	stopped := e.Call(t, "DELETE", "/api/v1/app-instances/"+id, acme.AdminToken, nil, pa)
	wantAnswer(t, stopped, 202, "", "")
	if stopped.Str("state") != "stopped" || stopped.Body["ended_at"] == nil {
		t.Fatalf("stopped: %s", stopped.Raw)
	}
	wantAnswer(t, e.Call(t, "DELETE", "/api/v1/app-instances/"+id, acme.AdminToken, nil, pa), 409, "app_instance_state_invalid", "final_state")
	wantAnswer(t, e.Call(t, "DELETE", "/api/v1/app-instances/"+id, other.AdminToken, nil, po), 404, "app_instance_not_found", "")
	if n := e.Count(t, `SELECT count(*) FROM audit_events WHERE action = 'app_instance.stop' AND target_id = $1`, id); n != 1 {
		t.Fatalf("%d stop audit rows", n)
	}
}

// A viewer of the project may read instances but not launch or stop them (the
// authorization table decides before the body is read).
func TestAppInstancesViewer(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	_, admin := e.PlatformAdmin(t)
	acme := e.NewTenant(t, admin, "Acme")
	pa := acme.DefaultProject.String()
	viewerID, viewer := e.NewUser(t, acme.AdminToken, "member")
	wantAnswer(t, e.Call(t, "POST", fmt.Sprintf("/api/v1/projects/%s/members", pa), acme.AdminToken,
		map[string]any{"user_id": viewerID, "role": "viewer"}, ""), 201, "", "")
	wantAnswer(t, e.Call(t, "GET", "/api/v1/app-instances", viewer, nil, pa), 200, "", "")
	req := e.Request("POST", "/api/v1/app-instances", viewer, `{"not json`)
	req.Header.Set("X-Project-ID", pa)
	a := e.Send(t, req)
	if a.Status != http.StatusForbidden || !strings.Contains(a.Code(), "permission") {
		t.Fatalf("viewer launch: %d %s", a.Status, a.Raw)
	}
}
