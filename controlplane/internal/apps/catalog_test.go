package apps_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func version(v string) map[string]any {
	return map[string]any{"version": v, "command": []string{"python3", "-m", "http.server", "{{port}}"}, "port": 8888,
		"health_check": map[string]any{"type": "http", "path": "/"}}
}

func want(t *testing.T, a apitest.Answer, status int, code, reason string) {
	t.Helper()
	if a.Status != status || (code != "" && a.Code() != code) || (reason != "" && a.Reason() != reason) {
		t.Fatalf("got %d %s/%s, want %d %s/%s: %s", a.Status, a.Code(), a.Reason(), status, code, reason, a.Raw)
	}
}

func entitledOf(t *testing.T, a apitest.Answer) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, it := range a.Body["items"].([]any) {
		m := it.(map[string]any)
		out[m["slug"].(string)] = m["entitled"].(bool)
	}
	return out
}

// The catalog and entitlement matrix: who sees which app as entitled, and which launch
// answers which code, in the documented order.
func TestCatalogEntitlementMatrix(t *testing.T) {
	e := apitest.New(t)
	ctx := context.Background()
	_, admin := e.PlatformAdmin(t)
	ta, tb := e.NewTenant(t, admin, "Tenant A"), e.NewTenant(t, admin, "Tenant B")
	pa, pb := ta.DefaultProject.String(), tb.DefaultProject.String()

	want(t, e.Call(t, "POST", "/api/v1/admin/apps", admin, map[string]any{"slug": "notebook", "name": "Notebook", "kind": "jupyter",
		"versions": []any{version("1.0"), version("2.0")}}, ""), 201, "", "")
	want(t, e.Call(t, "POST", "/api/v1/admin/apps", admin, map[string]any{"slug": "public-http", "name": "HTTP", "kind": "app",
		"versions": []any{version("1")}}, ""), 201, "", "")
	want(t, e.Call(t, "POST", "/api/v1/admin/apps/notebook/entitlements", admin, map[string]any{"tenant_id": ta.ID}, ""), 201, "", "")
	all := e.Call(t, "POST", "/api/v1/admin/apps/public-http/entitlements", admin, map[string]any{"tenant_id": nil}, "")
	want(t, all, 201, "", "")

	// Entitled per the caller's tenant (X-Project-ID's tenant).
	if got := entitledOf(t, e.Call(t, "GET", "/api/v1/apps", ta.AdminToken, nil, pa)); !got["notebook"] || !got["public-http"] {
		t.Fatalf("tenant A: %v", got)
	}
	if got := entitledOf(t, e.Call(t, "GET", "/api/v1/apps", tb.AdminToken, nil, pb)); got["notebook"] || !got["public-http"] {
		t.Fatalf("tenant B: %v", got)
	}
	// The admin listing marks only the all-tenants entitlement.
	if got := entitledOf(t, e.Call(t, "GET", "/api/v1/admin/apps", admin, nil, "")); got["notebook"] || !got["public-http"] {
		t.Fatalf("admin: %v", got)
	}
	// Tenant B cannot read with tenant A's project.
	want(t, e.Call(t, "GET", "/api/v1/apps", tb.AdminToken, nil, pa), 403, "insufficient_permissions", "")

	v := e.Call(t, "GET", "/api/v1/apps/notebook/versions/2.0", tb.AdminToken, nil, pb)
	want(t, v, 200, "", "")
	if hc := v.Body["health_check"].(map[string]any); hc["interval_seconds"].(float64) != 10 || hc["startup_timeout_seconds"].(float64) != 300 {
		t.Fatalf("defaults not applied: %v", hc)
	}
	want(t, e.Call(t, "GET", "/api/v1/apps/nope/versions/1", ta.AdminToken, nil, pa), 404, "app_not_found", "")
	want(t, e.Call(t, "GET", "/api/v1/apps/notebook/versions/9", ta.AdminToken, nil, pa), 404, "app_version_not_found", "")

	launch := func(tenant uuid.UUID, slug, ver string) apierr.Code {
		_, err := e.App.Apps.LaunchVersion(ctx, tenant, slug, ver)
		if err == nil {
			return ""
		}
		return apierr.CodeOf(err)
	}
	cases := []struct {
		tenant    uuid.UUID
		slug, ver string
		want      apierr.Code
	}{
		{ta.ID, "notebook", "1.0", ""},
		{tb.ID, "notebook", "1.0", apierr.AppNotEntitled},
		{tb.ID, "public-http", "1", ""},
		{ta.ID, "nope", "1", apierr.AppNotFound},
		{ta.ID, "notebook", "9", apierr.AppVersionNotFound},
		// An unknown app beats entitlement: tenant B learns nothing more about notebook.
		{tb.ID, "notebook", "9", apierr.AppVersionNotFound},
	}
	for _, c := range cases {
		if got := launch(c.tenant, c.slug, c.ver); got != c.want {
			t.Errorf("launch %s %s@%s = %q, want %q", c.tenant, c.slug, c.ver, got, c.want)
		}
	}

	// Deprecating a version refuses its launch; the other stays; restoring undoes it.
	want(t, e.Call(t, "PATCH", "/api/v1/admin/apps/notebook/versions/1.0", admin, map[string]any{"deprecated": true}, ""), 200, "", "")
	if _, err := e.App.Apps.LaunchVersion(ctx, ta.ID, "notebook", "1.0"); apierr.CodeOf(err) != apierr.AppVersionNotFound {
		t.Fatalf("deprecated version: %v", err)
	}
	if got := launch(ta.ID, "notebook", "2.0"); got != "" {
		t.Fatalf("2.0: %s", got)
	}
	want(t, e.Call(t, "PATCH", "/api/v1/admin/apps/notebook/versions/1.0", admin, map[string]any{"deprecated": true}, ""), 200, "", "")
	if n := e.Count(t, `SELECT count(*) FROM audit_events WHERE action = 'app.version.deprecate'`); n != 1 {
		t.Fatalf("deprecating twice wrote %d audit rows, want 1", n)
	}
	// A deprecated app: listed and marked, not launched.
	a := e.Call(t, "PATCH", "/api/v1/admin/apps/notebook", admin, map[string]any{"deprecated": true}, "")
	want(t, a, 200, "", "")
	if a.Body["deprecated"] != true || a.Body["latest_version"] != "2.0" {
		t.Fatalf("deprecated app: %s", a.Raw)
	}
	if got := launch(ta.ID, "notebook", "2.0"); got != apierr.AppNotFound {
		t.Fatalf("deprecated app launch: %s", got)
	}
	want(t, e.Call(t, "PATCH", "/api/v1/admin/apps/notebook", admin, map[string]any{"deprecated": false}, ""), 200, "", "")
	if got := launch(ta.ID, "notebook", "2.0"); got != "" {
		t.Fatalf("restored app launch: %s", got)
	}

	// Removing the all-tenants entitlement refuses tenant B's next launch.
	want(t, e.Call(t, "DELETE", "/api/v1/admin/apps/public-http/entitlements/"+all.Str("id"), admin, nil, ""), 204, "", "")
	if got := launch(tb.ID, "public-http", "1"); got != apierr.AppNotEntitled {
		t.Fatalf("after removal: %s", got)
	}
	want(t, e.Call(t, "DELETE", "/api/v1/admin/apps/public-http/entitlements/"+all.Str("id"), admin, nil, ""), 404, "app_not_found", "entitlement_not_found")
}

// Bad input: the contract's envelope and code, nothing persisted; only platform admins.
func TestAdminAppsRefusals(t *testing.T) {
	e := apitest.New(t)
	_, admin := e.PlatformAdmin(t)
	ta := e.NewTenant(t, admin, "Tenant A")
	persisted := func() int {
		return e.Count(t, `SELECT (SELECT count(*) FROM apps) + (SELECT count(*) FROM app_versions) + (SELECT count(*) FROM app_entitlements)`)
	}
	base := func() map[string]any {
		return map[string]any{"slug": "web", "name": "Web", "kind": "app", "versions": []any{version("1")}}
	}
	with := func(f func(m map[string]any)) map[string]any { m := base(); f(m); return m }
	ver := func(f func(v map[string]any)) map[string]any {
		return with(func(m map[string]any) { v := version("1"); f(v); m["versions"] = []any{v} })
	}
	cases := []struct {
		name         string
		token        string
		body         map[string]any
		status       int
		code, reason string
	}{
		{"tenant admin", ta.AdminToken, base(), 403, "admin_required", ""},
		{"no token", "", base(), 401, "token_missing", ""},
		{"slug pattern", admin, with(func(m map[string]any) { m["slug"] = "Web_1" }), 422, "validation_error", ""},
		{"slug too short", admin, with(func(m map[string]any) { m["slug"] = "w" }), 422, "validation_error", ""},
		{"slug 64 chars", admin, with(func(m map[string]any) { m["slug"] = repeat("b", 64) }), 422, "validation_error", ""},
		{"unknown kind", admin, with(func(m map[string]any) { m["kind"] = "game" }), 422, "validation_error", ""},
		{"version 65 chars", admin, ver(func(v map[string]any) { v["version"] = repeat("v", 65) }), 422, "validation_error", ""},
		{"version empty", admin, ver(func(v map[string]any) { v["version"] = "" }), 422, "validation_error", ""},
		{"port below 1024", admin, ver(func(v map[string]any) { v["port"] = 80 }), 422, "validation_error", ""},
		{"empty command", admin, ver(func(v map[string]any) { v["command"] = []string{} }), 422, "validation_error", ""},
		{"http without path", admin, ver(func(v map[string]any) { v["health_check"] = map[string]any{"type": "http"} }), 422, "validation_error", ""},
		{"tcp with path", admin, ver(func(v map[string]any) { v["health_check"] = map[string]any{"type": "tcp", "path": "/"} }), 422, "validation_error", ""},
		{"duplicate env", admin, ver(func(v map[string]any) {
			v["env"] = []any{map[string]any{"name": "A", "value": "1"}, map[string]any{"name": "A", "value": "2"}}
		}), 422, "validation_error", "duplicate_env"},
		{"duplicate version", admin, with(func(m map[string]any) { m["versions"] = []any{version("1"), version("1")} }), 422, "validation_error", "duplicate_version"},
		{"unknown field", admin, with(func(m map[string]any) { m["owner"] = "x" }), 422, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := e.Call(t, "POST", "/api/v1/admin/apps", c.token, c.body, "")
			want(t, a, c.status, c.code, c.reason)
			if n := persisted(); n != 0 {
				t.Fatalf("%d rows persisted", n)
			}
		})
	}
	// The edges that are allowed: a 63-character slug, a 64-character version, port 1024 and 65535.
	long := with(func(m map[string]any) {
		m["slug"] = repeat("a", 63)
		v1, v2 := version(repeat("v", 64)), version("2")
		v1["port"], v2["port"] = 1024, 65535
		m["versions"] = []any{v1, v2}
	})
	want(t, e.Call(t, "POST", "/api/v1/admin/apps", admin, long, ""), 201, "", "")
	want(t, e.Call(t, "POST", "/api/v1/admin/apps", admin, with(func(m map[string]any) { m["slug"] = repeat("a", 63) }), ""), 409, "invalid_request", "app_exists")
	want(t, e.Call(t, "POST", "/api/v1/admin/apps/"+repeat("a", 63)+"/versions", admin, version("2"), ""), 409, "invalid_request", "version_exists")
	want(t, e.Call(t, "POST", "/api/v1/admin/apps/missing/versions", admin, version("2"), ""), 404, "app_not_found", "")
	want(t, e.Call(t, "POST", "/api/v1/admin/apps/"+repeat("a", 63)+"/entitlements", admin, map[string]any{"tenant_id": uuid.New()}, ""), 422, "validation_error", "tenant_not_found")
	want(t, e.Call(t, "POST", "/api/v1/admin/apps/"+repeat("a", 63)+"/entitlements", admin, map[string]any{"tenant_id": ta.ID}, ""), 201, "", "")
	want(t, e.Call(t, "POST", "/api/v1/admin/apps/"+repeat("a", 63)+"/entitlements", admin, map[string]any{"tenant_id": ta.ID}, ""), 409, "invalid_request", "entitlement_exists")
	want(t, e.Call(t, "POST", "/api/v1/admin/apps/"+repeat("a", 63)+"/entitlements", ta.AdminToken, map[string]any{"tenant_id": ta.ID}, ""), 403, "admin_required", "")
	if n := e.Count(t, `SELECT count(*) FROM app_entitlements`); n != 1 {
		t.Fatalf("%d entitlements, want 1", n)
	}
	// Each change was audited once, in its transaction.
	if n := e.Count(t, `SELECT count(*) FROM audit_events WHERE action IN ('app.create', 'app.entitle')`); n != 2 {
		t.Fatalf("%d audit rows, want 2", n)
	}
}

// Cursor pagination walks the catalog by slug without repeats.
func TestCatalogPagination(t *testing.T) {
	e := apitest.New(t)
	_, admin := e.PlatformAdmin(t)
	ta := e.NewTenant(t, admin, "Tenant A")
	for _, s := range []string{"c-app", "a-app", "b-app"} {
		want(t, e.Call(t, "POST", "/api/v1/admin/apps", admin, map[string]any{"slug": s, "name": s, "kind": "app"}, ""), 201, "", "")
	}
	var seen []string
	path := "/api/v1/apps?page_size=1"
	for i := 0; i < 5; i++ {
		a := e.Call(t, "GET", path, ta.AdminToken, nil, ta.DefaultProject.String())
		want(t, a, http.StatusOK, "", "")
		for s := range entitledOf(t, a) {
			seen = append(seen, s)
		}
		next, _ := a.Body["pagination"].(map[string]any)["next_cursor"].(string)
		if next == "" {
			break
		}
		path = "/api/v1/apps?page_size=1&cursor=" + next
	}
	if len(seen) != 3 || seen[0] != "a-app" || seen[2] != "c-app" {
		t.Fatalf("pages: %v", seen)
	}
	want(t, e.Call(t, "GET", "/api/v1/apps?page_size=201", ta.AdminToken, nil, ta.DefaultProject.String()), 422, "validation_error", "")
	want(t, e.Call(t, "GET", "/api/v1/apps", ta.AdminToken, nil, ""), 400, "invalid_request", "")
}

func repeat(s string, n int) string {
	out := ""
	for i := 0; i < n; i++ {
		out += s
	}
	return out
}

// An Idempotency-Key replays the first answer of a create and writes once.
func TestCreateAppIdempotent(t *testing.T) {
	e := apitest.New(t)
	_, admin := e.PlatformAdmin(t)
	body := `{"slug":"idem-app","name":"Idem","kind":"app","versions":[{"version":"1","command":["true"],"port":8080,"health_check":{"type":"tcp"}}]}`
	var first string
	for i := 0; i < 2; i++ {
		req := e.Request("POST", "/api/v1/admin/apps", admin, body)
		req.Header.Set("Idempotency-Key", "create-idem-app")
		a := e.Send(t, req)
		want(t, a, 201, "", "")
		if i == 0 {
			first = a.Raw
		} else if a.Raw != first {
			t.Fatalf("replay differs:\n%s\n%s", first, a.Raw)
		}
	}
	if n := e.Count(t, `SELECT count(*) FROM audit_events WHERE action = 'app.create'`); n != 1 {
		t.Fatalf("%d creates audited, want 1", n)
	}
	req := e.Request("POST", "/api/v1/admin/apps", admin, `{"slug":"other-app","name":"Other","kind":"app"}`)
	req.Header.Set("Idempotency-Key", "create-idem-app")
	want(t, e.Send(t, req), 422, "", "")
	if n := e.Count(t, `SELECT count(*) FROM apps`); n != 1 {
		t.Fatalf("%d apps, want 1", n)
	}
}
