package readmodels_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/readmodels"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// env is a control plane on a manual clock (control-plane time drives actionability).
type env struct {
	*apitest.Env
	clk *clock.Manual
}

func newEnv(t *testing.T) env {
	t.Helper()
	clk := clock.NewManual(time.Now().UTC().Truncate(time.Millisecond))
	e := apitest.New(t, apitest.WithOptions(func(o *app.Options) { o.Clock = clk }))
	return env{Env: e, clk: clk}
}

// alloc writes an allocation row of project as a fixture (the read models read the
// allocations table; driving a real launch to every status needs a node agent, which
// the allocations suite does). updated is when it entered status.
func (e env) alloc(t *testing.T, tenant, project, owner uuid.UUID, name, status string, created, updated time.Time) uuid.UUID {
	t.Helper()
	id := e.App.IDs.New()
	_, err := e.Pool.Exec(context.Background(), `
INSERT INTO allocations (id, tenant_id, project_id, owner_user_id, name, sku, gpu_model, gpu_count, usage_unit, region_code,
    node_id, ssh_key_ids, ssh_public_keys, status, hourly_rate_minor, currency, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, 'h100.1x', 'NVIDIA H100', 1, 'gpu.h100', 'eu-west-1', $6, '{}', '{}', $7, 250, 'USD', $8, $9)`,
		id, tenant, project, owner, name, uuid.New(), status, created, updated)
	if err != nil {
		t.Fatalf("fixture allocation: %v", err)
	}
	return id
}

func (e env) member(t *testing.T, project, user uuid.UUID, role string) {
	t.Helper()
	now := e.clk.Now()
	if _, err := e.Pool.Exec(context.Background(), `INSERT INTO project_members (project_id, user_id, role, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $4) ON CONFLICT (project_id, user_id) DO UPDATE SET role = EXCLUDED.role`, project, user, role, now); err != nil {
		t.Fatal(err)
	}
}

func items(a apitest.Answer) []map[string]any {
	raw, _ := a.Body["items"].([]any)
	out := make([]map[string]any, 0, len(raw))
	for _, r := range raw {
		out = append(out, r.(map[string]any))
	}
	return out
}

func shellCtx(a apitest.Answer) map[string]any { c, _ := a.Body["context"].(map[string]any); return c }

func modes(c map[string]any) []string {
	var out []string
	for _, m := range c["available_modes"].([]any) {
		out = append(out, m.(string))
	}
	return out
}

// Shell modes follow the caller's roles, for each combination.
func TestShellModesPerRoleCombination(t *testing.T) {
	e := newEnv(t)
	_, padmin := e.PlatformAdmin(t)
	acme := e.NewTenant(t, padmin, "Acme")
	memberID, memberTok := e.NewUser(t, acme.AdminToken, "member")
	e.member(t, acme.DefaultProject, memberID, "member")
	// A tenant member who administers the default project.
	leadID, leadTok := e.NewUser(t, acme.AdminToken, "member")
	e.member(t, acme.DefaultProject, leadID, "admin")
	opsID, opsTok := e.NewUser(t, acme.AdminToken, "member")
	if _, err := e.Pool.Exec(context.Background(), `INSERT INTO platform_role_bindings (user_id, role, created_at) VALUES ($1, 'platform_ops', $2)`, opsID, e.clk.Now()); err != nil {
		t.Fatal(err)
	}
	opsTok = e.Token(t, opsID)
	// A platform superadmin who is also the tenant's admin.
	if _, err := e.Pool.Exec(context.Background(), `UPDATE users SET role = 'admin' WHERE id = $1`, acme.AdminID); err != nil {
		t.Fatal(err)
	}
	bothTok := e.Token(t, acme.AdminID)

	for _, tc := range []struct {
		name, token string
		want        []string
		landing     map[string]string
	}{
		{"tenant member", memberTok, []string{"user"}, map[string]string{"user": "/workloads"}},
		{"project admin", leadTok, []string{"user", "project_admin"}, map[string]string{"project_admin": "/projects/" + acme.DefaultProject.String() + "/settings"}},
		{"tenant admin and platform superadmin", bothTok, []string{"user", "project_admin", "tenant_admin", "platform_admin", "ops"},
			map[string]string{"project_admin": "/projects/" + acme.DefaultProject.String() + "/settings", "tenant_admin": "/organization", "platform_admin": "/admin", "ops": "/ops"}},
		{"platform superadmin outside a tenant", padmin, []string{"platform_admin", "ops"}, map[string]string{"platform_admin": "/admin"}},
		{"tenant member with platform_ops", opsTok, []string{"user", "ops"}, map[string]string{"ops": "/ops"}},
		{"tenant admin", acme.AdminToken, []string{"user", "project_admin", "tenant_admin"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := tc.token
			if tc.name == "tenant admin" {
				// The same admin without the superadmin role: a second tenant's admin.
				other := e.NewTenant(t, padmin, "Other")
				tok = other.AdminToken
			}
			a := e.Call(t, http.MethodGet, "/api/v1/v3/shell/context", tok, nil, "")
			if a.Status != http.StatusOK {
				t.Fatalf("%d %s", a.Status, a.Raw)
			}
			c := shellCtx(a)
			if got := modes(c); !slices.Equal(got, tc.want) {
				t.Fatalf("available_modes = %v, want %v", got, tc.want)
			}
			if c["mode"] != tc.want[0] {
				t.Errorf("default mode = %v, want %s", c["mode"], tc.want[0])
			}
			for _, o := range c["mode_options"].([]any) {
				opt := o.(map[string]any)
				if want, ok := tc.landing[opt["id"].(string)]; ok && opt["default_landing"] != want {
					t.Errorf("%s landing = %v, want %s", opt["id"], opt["default_landing"], want)
				}
				if opt["is_active"] != (opt["id"] == tc.want[0]) {
					t.Errorf("%s is_active = %v", opt["id"], opt["is_active"])
				}
			}
			// Choosing the last mode marks it active; a mode not held is refused.
			last := tc.want[len(tc.want)-1]
			a = e.Call(t, http.MethodGet, "/api/v1/v3/shell/context?mode="+last, tok, nil, "")
			if a.Status != http.StatusOK || shellCtx(a)["mode"] != last {
				t.Fatalf("mode=%s: %d %s", last, a.Status, a.Raw)
			}
			if !slices.Contains(tc.want, "platform_admin") {
				a = e.Call(t, http.MethodGet, "/api/v1/v3/shell/context?mode=platform_admin", tok, nil, "")
				if a.Status != http.StatusForbidden || a.Code() != "insufficient_permissions" {
					t.Fatalf("mode not held: %d %s", a.Status, a.Raw)
				}
			}
		})
	}
	// An unknown mode is a validation error naming the parameter.
	a := e.Call(t, http.MethodGet, "/api/v1/v3/shell/context?mode=wizard", memberTok, nil, "")
	if a.Status != http.StatusUnprocessableEntity || a.Code() != "validation_error" || !containsField(a, "mode") {
		t.Fatalf("unknown mode: %d %s", a.Status, a.Raw)
	}
}

func containsField(a apitest.Answer, name string) bool {
	d, _ := a.Body["details"].(map[string]any)
	f, _ := d["field"].(string)
	return f == name || fmt.Sprint(d["parameter"]) == name
}

// The attention counters are exact, meta.cache says where the answer came from, and a
// dismissal and the read marker change the caller's counters only.
func TestShellAttentionCountersAndCache(t *testing.T) {
	e := newEnv(t)
	_, padmin := e.PlatformAdmin(t)
	acme := e.NewTenant(t, padmin, "Acme")
	p := acme.DefaultProject
	bobID, bobTok := e.NewUser(t, acme.AdminToken, "member")
	e.member(t, p, bobID, "member")
	now := e.clk.Now()
	e.alloc(t, acme.ID, p, bobID, "a1", "active", now.Add(-3*time.Hour), now.Add(-2*time.Hour))
	e.alloc(t, acme.ID, p, bobID, "a2", "provisioning", now.Add(-time.Hour), now.Add(-time.Hour))
	rf := e.alloc(t, acme.ID, p, bobID, "a3", "release_failed", now.Add(-5*time.Hour), now.Add(-time.Hour))
	e.alloc(t, acme.ID, p, bobID, "a4", "released", now.Add(-9*time.Hour), now.Add(-8*time.Hour))
	e.alloc(t, acme.ID, p, bobID, "old", "release_failed", now.Add(-200*time.Hour), now.Add(-100*time.Hour)) // aged out
	// An unfinished task of a2 and a finished one of a1.
	if _, err := e.Pool.Exec(context.Background(), `INSERT INTO allocation_tasks (task_id, allocation_id, node_id, kind, created_at)
		SELECT $1, id, node_id, 'allocation.provision', $2 FROM allocations WHERE name = 'a2'`, uuid.New(), now); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Pool.Exec(context.Background(), `INSERT INTO allocation_tasks (task_id, allocation_id, node_id, kind, created_at, finished_at)
		SELECT $1, id, node_id, 'allocation.provision', $2, $2 FROM allocations WHERE name = 'a1'`, uuid.New(), now); err != nil {
		t.Fatal(err)
	}
	// Two status events after bob's account existed, one before.
	for i, at := range []time.Time{now.Add(-30 * time.Minute), now.Add(-10 * time.Minute), now.Add(-1000 * time.Hour)} {
		if _, err := e.Pool.Exec(context.Background(), `INSERT INTO allocation_events (id, allocation_id, to_status, event, actor_type, created_at)
			VALUES ($1, $2, 'release_failed', $3, 'system', $4)`, uuid.New(), rf, fmt.Sprintf("e%d", i), at); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.Pool.Exec(context.Background(), `UPDATE users SET created_at = $3 WHERE id IN ($1, $2)`, bobID, acme.AdminID, now.Add(-48*time.Hour)); err != nil {
		t.Fatal(err)
	}
	att := func(tok string, req *http.Request) (map[string]any, string) {
		t.Helper()
		a := e.Send(t, req)
		if a.Status != http.StatusOK {
			t.Fatalf("%d %s", a.Status, a.Raw)
		}
		c := shellCtx(a)
		return c["attention"].(map[string]any), c["meta"].(map[string]any)["cache"].(string)
	}
	get := func(tok string, noCache bool) *http.Request {
		r := e.Request(http.MethodGet, "/api/v1/v3/shell/context", tok, "")
		r.Header.Set("X-Project-ID", p.String())
		if noCache {
			r.Header.Set("Cache-Control", "no-cache")
		}
		return r
	}
	want := map[string]any{"active_workloads": 2.0, "needs_action": 1.0, "active_tasks": 1.0, "unread_notifications": 2.0}
	got, cache := att(bobTok, get(bobTok, false))
	if fmt.Sprint(got) != fmt.Sprint(want) || cache != "miss" {
		t.Fatalf("first: %v (%s), want %v (miss)", got, cache, want)
	}
	if _, cache = att(bobTok, get(bobTok, false)); cache != "hit" {
		t.Fatalf("second answer: cache %s, want hit", cache)
	}
	if _, cache = att(bobTok, get(bobTok, true)); cache != "bypass" {
		t.Fatalf("no-cache: cache %s, want bypass", cache)
	}
	e.clk.Advance(readmodels.DefaultCacheTTL + time.Second)
	if _, cache = att(bobTok, get(bobTok, false)); cache != "miss" {
		t.Fatalf("after the TTL: cache %s, want miss", cache)
	}

	// Bob dismisses the release failure: his needs_action drops, the admin's does not.
	key := readmodels.AttentionKey(readmodels.AllocationWorkloadID(rf), "release_failed", now.Add(-time.Hour))
	a := e.Call(t, http.MethodPost, "/api/v1/v3/attention/"+url.PathEscape(key)+"/dismiss", bobTok, nil, "")
	if a.Status != http.StatusOK || a.Str("attention_key") != key {
		t.Fatalf("dismiss: %d %s", a.Status, a.Raw)
	}
	first := a.Str("dismissed_at")
	e.clk.Advance(time.Minute)
	a = e.Call(t, http.MethodPost, "/api/v1/v3/attention/"+url.PathEscape(key)+"/dismiss", bobTok, nil, "")
	if a.Status != http.StatusOK || a.Str("dismissed_at") != first {
		t.Fatalf("repeat dismiss: %d %s (first %s)", a.Status, a.Raw, first)
	}
	if n := e.Count(t, `SELECT count(*) FROM audit_events WHERE action = 'v3.attention.dismiss' AND target_id = $1`, key); n != 1 {
		t.Fatalf("dismissal audited %d times, want once", n)
	}
	got, cache = att(bobTok, get(bobTok, false))
	if got["needs_action"] != 0.0 || cache != "miss" {
		t.Fatalf("after dismissal (cache forgotten): %v (%s)", got, cache)
	}
	got, _ = att(acme.AdminToken, get(acme.AdminToken, false))
	if got["needs_action"] != 1.0 {
		t.Fatalf("the admin's needs_action = %v, want 1 (the dismissal is bob's only)", got["needs_action"])
	}

	// The read marker: everything up to now is read.
	a = e.Call(t, http.MethodPut, "/api/v1/v3/notifications/read-marker", bobTok, map[string]any{"read_through": nil}, "")
	if a.Status != http.StatusOK || a.Body["unread_notifications"] != 0.0 {
		t.Fatalf("read marker: %d %s", a.Status, a.Raw)
	}
	// It never moves backwards.
	a = e.Call(t, http.MethodPut, "/api/v1/v3/notifications/read-marker", bobTok, map[string]any{"read_through": now.Add(-time.Hour)}, "")
	if a.Status != http.StatusOK || a.Body["unread_notifications"] != 0.0 {
		t.Fatalf("backwards marker: %d %s", a.Status, a.Raw)
	}
	got, _ = att(bobTok, get(bobTok, false))
	if got["unread_notifications"] != 0.0 {
		t.Fatalf("unread after marking: %v", got)
	}
	got, _ = att(acme.AdminToken, get(acme.AdminToken, true))
	if got["unread_notifications"] == 0.0 {
		t.Fatalf("the admin's unread count moved with bob's marker: %v", got)
	}
}

// Dismissing an item the caller cannot see, or one that no longer holds, is not found.
func TestDismissBadKeys(t *testing.T) {
	e := newEnv(t)
	_, padmin := e.PlatformAdmin(t)
	acme := e.NewTenant(t, padmin, "Acme")
	globex := e.NewTenant(t, padmin, "Globex")
	now := e.clk.Now()
	theirs := e.alloc(t, globex.ID, globex.DefaultProject, globex.AdminID, "g", "release_failed", now, now)
	key := readmodels.AttentionKey(readmodels.AllocationWorkloadID(theirs), "release_failed", now)
	a := e.Call(t, http.MethodPost, "/api/v1/v3/attention/"+url.PathEscape(key)+"/dismiss", acme.AdminToken, nil, "")
	if a.Status != http.StatusNotFound {
		t.Fatalf("another tenant's item: %d %s", a.Status, a.Raw)
	}
	stale := readmodels.AttentionKey(readmodels.AllocationWorkloadID(theirs), "release_failed", now.Add(-time.Minute))
	if a = e.Call(t, http.MethodPost, "/api/v1/v3/attention/"+url.PathEscape(stale)+"/dismiss", globex.AdminToken, nil, ""); a.Status != http.StatusNotFound {
		t.Fatalf("an item that no longer holds: %d %s", a.Status, a.Raw)
	}
	if a = e.Call(t, http.MethodPost, "/api/v1/v3/attention/"+url.PathEscape("alloc:"+theirs.String()+".active.1")+"/dismiss", globex.AdminToken, nil, ""); a.Status != http.StatusNotFound {
		t.Fatalf("a condition that is no recovery condition: %d %s", a.Status, a.Raw)
	}
	if a = e.Call(t, http.MethodPost, "/api/v1/v3/attention/"+url.PathEscape("-bad key")+"/dismiss", globex.AdminToken, nil, ""); a.Status != http.StatusUnprocessableEntity || a.Code() != "validation_error" {
		t.Fatalf("a malformed key: %d %s", a.Status, a.Raw)
	}
	if n := e.Count(t, `SELECT count(*) FROM v3_attention_dismissals`); n != 0 {
		t.Fatalf("%d dismissals persisted by refused requests", n)
	}
}
