package auth_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

// metric is the value of the counter name in the app's registry.
func metric(t *testing.T, e *apitest.Env, name string) float64 {
	t.Helper()
	mfs, err := e.App.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var v float64
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
			return v
		}
	}
	t.Fatalf("metric %s is not registered", name)
	return 0
}

// steppedUpAdmin is a platform superadmin (fixture row, migrated into a binding by the
// users.role trigger) with an active TOTP factor, its sign-in token and a step-up token.
func steppedUpAdmin(t *testing.T, e *apitest.Env, clk *clock.Manual) (id uuid.UUID, tok, stepTok string) {
	t.Helper()
	id, tok = e.PlatformAdmin(t)
	en := call(t, e, "POST", "/api/v1/account/security/mfa/totp", tok, nil)
	want(t, "admin enrols", en, 201, "", "")
	secret := en.Body["secret"].(string)
	want(t, "admin verifies", call(t, e, "POST", "/api/v1/account/security/mfa/totp/verify", tok,
		map[string]string{"totp_code": oathtool(t, secret, clk.Now())}), 200, "", "")
	clk.Advance(30 * time.Second)
	su := call(t, e, "POST", "/api/v1/auth/step-up", tok, map[string]string{"totp_code": oathtool(t, secret, clk.Now())})
	want(t, "admin steps up", su, 200, "", "")
	return id, tok, su.Body["access_token"].(string)
}

func bindingCount(t *testing.T, e *apitest.Env, userID uuid.UUID, role string) int {
	return count(t, e, `SELECT count(*) FROM platform_role_bindings WHERE user_id = $1 AND role = $2`, userID, role)
}

// TestPlatformRoleBindAndRevoke: bind needs step-up (nothing changes without it), a
// bound platform_ops user reaches ops read models with its next token, /me reports
// bindings, counters move, changes are audited, the last superadmin stays, and a
// missing store answers service_unavailable.
func TestPlatformRoleBindAndRevoke(t *testing.T) {
	e, clk := newMFAEnv(t)
	adminID, adminTok, stepTok := steppedUpAdmin(t, e, clk)
	ten := e.NewTenant(t, adminTok, "Roles")
	opsID := ten.AdminID
	bindPath := "/api/v1/admin/platform-roles/platform_ops/bindings"

	me := call(t, e, "GET", "/api/v1/me", adminTok, nil)
	want(t, "admin /me", me, 200, "", "")
	if me.Body["platform_role_source"] != "bindings" || fmt.Sprint(me.Body["platform_roles"]) != "[platform_superadmin]" {
		t.Fatalf("admin /me: source %v roles %v", me.Body["platform_role_source"], me.Body["platform_roles"])
	}
	want(t, "fleet telemetry before the binding", call(t, e, "GET", "/api/v1/admin/telemetry/fleet", ten.AdminToken, nil), 403, "admin_required", "")

	// Without step-up: refused, nothing changed, counted as a denial.
	denied := metric(t, e, "api_platform_role_admin_denied_total")
	want(t, "bind without step-up", call(t, e, "POST", bindPath, adminTok, map[string]any{"user_id": opsID}), 403, "step_up_required", "")
	want(t, "bind as a tenant admin with an empty body", call(t, e, "POST", bindPath, ten.AdminToken, map[string]any{}), 403, "admin_required", "")
	want(t, "list as a tenant admin", call(t, e, "GET", "/api/v1/admin/platform-roles", ten.AdminToken, nil), 403, "admin_required", "")
	if n := bindingCount(t, e, opsID, "platform_ops"); n != 0 {
		t.Fatal("a refused bind wrote a binding")
	}
	if got := metric(t, e, "api_platform_role_admin_denied_total") - denied; got != 3 {
		t.Fatalf("admin_denied moved by %v, want 3", got)
	}
	if got := metric(t, e, "api_platform_role_bind_requests_total"); got != 0 {
		t.Fatalf("bind_requests %v after refusals only, want 0", got)
	}

	// With step-up: bound (201), again 200 without a second audit row.
	b := call(t, e, "POST", bindPath, stepTok, map[string]any{"user_id": opsID})
	want(t, "bind with step-up", b, 201, "", "")
	if b.Body["granted_by"] != adminID.String() || b.Body["role"] != "platform_ops" || b.Body["username"] != ten.AdminUsername {
		t.Fatalf("binding: %v", b.Body)
	}
	want(t, "bind again", call(t, e, "POST", bindPath, stepTok, map[string]any{"user_id": opsID}), 200, "", "")
	want(t, "bind an unknown user", call(t, e, "POST", bindPath, stepTok, map[string]any{"user_id": uuid.New()}), 404, "user_not_found", "")
	if n := count(t, e, `SELECT count(*) FROM audit_events WHERE action = 'platform_role.bind' AND target_id = $1`, opsID.String()); n != 1 {
		t.Fatalf("%d bind audit rows, want 1", n)
	}
	if got := metric(t, e, "api_platform_role_bind_requests_total"); got != 3 {
		t.Fatalf("bind_requests %v, want 3", got)
	}
	if s, f := metric(t, e, "api_platform_role_mutation_success_total"), metric(t, e, "api_platform_role_mutation_failure_total"); s != 2 || f != 1 {
		t.Fatalf("mutations success %v failure %v, want 2 and 1", s, f)
	}

	// The operator's next token carries the role and opens the ops read models.
	opsTok := e.Token(t, opsID)
	want(t, "fleet telemetry as platform_ops", call(t, e, "GET", "/api/v1/admin/telemetry/fleet", opsTok, nil), 200, "", "")
	me = call(t, e, "GET", "/api/v1/me", opsTok, nil)
	if me.Body["platform_role_source"] != "bindings" || fmt.Sprint(me.Body["platform_roles"]) != "[platform_ops]" {
		t.Fatalf("ops /me: source %v roles %v", me.Body["platform_role_source"], me.Body["platform_roles"])
	}
	want(t, "platform_ops cannot bind", call(t, e, "POST", bindPath, opsTok, map[string]any{"user_id": opsID}), 403, "admin_required", "")

	l := call(t, e, "GET", "/api/v1/admin/platform-roles", adminTok, nil)
	want(t, "list", l, 200, "", "")
	if got := fmt.Sprint(l.Body["roles"]); got == "" || metric(t, e, "api_platform_role_list_requests_total") != 1 {
		t.Fatalf("list: %v", l.Body)
	}
	roles := l.Body["roles"].([]any)
	super, ops := roles[0].(map[string]any), roles[1].(map[string]any)
	if super["role"] != "platform_superadmin" || len(super["bindings"].([]any)) != 1 || ops["role"] != "platform_ops" || len(ops["bindings"].([]any)) != 1 {
		t.Fatalf("list by role: %v", roles)
	}
	if g := super["bindings"].([]any)[0].(map[string]any); g["user_id"] != adminID.String() || g["granted_by"] != nil {
		t.Fatalf("migrated superadmin binding: %v", g)
	}

	// The last superadmin stays; a missing binding is 404; revoke is audited.
	superPath := "/api/v1/admin/platform-roles/platform_superadmin/bindings/" + adminID.String()
	want(t, "revoke without step-up", call(t, e, "DELETE", superPath, adminTok, nil), 403, "step_up_required", "")
	want(t, "revoke the last superadmin", call(t, e, "DELETE", superPath, stepTok, nil), 409, "invalid_request", "last_superadmin")
	if n := bindingCount(t, e, adminID, "platform_superadmin"); n != 1 {
		t.Fatal("the last superadmin binding is gone")
	}
	opsPath := "/api/v1/admin/platform-roles/platform_ops/bindings/" + opsID.String()
	want(t, "revoke ops", call(t, e, "DELETE", opsPath, stepTok, nil), 204, "", "")
	want(t, "revoke ops again", call(t, e, "DELETE", opsPath, stepTok, nil), 404, "invalid_request", "binding_not_found")
	if n := count(t, e, `SELECT count(*) FROM audit_events WHERE action = 'platform_role.revoke' AND target_id = $1`, opsID.String()); n != 1 {
		t.Fatalf("%d revoke audit rows, want 1", n)
	}
	if got := metric(t, e, "api_platform_role_revoke_requests_total"); got != 3 {
		t.Fatalf("revoke_requests %v, want 3", got)
	}
	want(t, "fleet telemetry after the revocation (new token)", call(t, e, "GET", "/api/v1/admin/telemetry/fleet", e.Token(t, opsID), nil), 403, "admin_required", "")

	// The store without its table: service_unavailable, counted (seed §7.3 rule 4).
	owner, err := pgx.Connect(context.Background(), testenv.OwnerURL(t, e.Pool.Config().ConnString()))
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close(context.Background())
	if _, err := owner.Exec(context.Background(), `ALTER TABLE platform_role_bindings RENAME TO platform_role_bindings_gone`); err != nil {
		t.Fatal(err)
	}
	want(t, "list without the store", call(t, e, "GET", "/api/v1/admin/platform-roles", adminTok, nil), 503, "service_unavailable", "")
	want(t, "bind without the store", call(t, e, "POST", bindPath, stepTok, map[string]any{"user_id": opsID}), 503, "service_unavailable", "")
	if got := metric(t, e, "api_platform_role_service_unavailable_total"); got != 2 {
		t.Fatalf("service_unavailable counted %v, want 2", got)
	}
	if _, err := owner.Exec(context.Background(), `ALTER TABLE platform_role_bindings_gone RENAME TO platform_role_bindings`); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentSuperadminRevocations: two superadmins revoked at once leave one (the
// platform roles lock serializes the last-superadmin check), in every round.
func TestConcurrentSuperadminRevocations(t *testing.T) {
	e, clk := newMFAEnv(t)
	adminID, _, stepTok := steppedUpAdmin(t, e, clk)
	for round := range 5 {
		other, _ := e.PlatformAdmin(t) // a second superadmin (binding via users.role)
		ids := []uuid.UUID{adminID, other}
		var wg sync.WaitGroup
		start := make(chan struct{})
		got := make([]answer, 2)
		for i, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				got[i] = call(t, e, "DELETE", "/api/v1/admin/platform-roles/platform_superadmin/bindings/"+id.String(), stepTok, nil)
			}()
		}
		close(start)
		wg.Wait()
		ok, refused := 0, 0
		for _, a := range got {
			switch {
			case a.Status == 204:
				ok++
			case a.Status == 409 && a.Reason() == "last_superadmin":
				refused++
			default:
				t.Fatalf("round %d: %d %v", round, a.Status, a.Body)
			}
		}
		n := count(t, e, `SELECT count(*) FROM platform_role_bindings WHERE role = 'platform_superadmin'`)
		if ok != 1 || refused != 1 || n != 1 {
			t.Fatalf("round %d: %d revoked, %d refused, %d superadmins left; want 1, 1, 1", round, ok, refused, n)
		}
		// Keep the stepped-up admin a superadmin for the next round.
		if bindingCount(t, e, adminID, "platform_superadmin") == 0 {
			if _, err := e.Pool.Exec(context.Background(), `UPDATE users SET role = 'admin' WHERE id = $1`, adminID); err != nil {
				t.Fatal(err)
			}
			if _, err := e.Pool.Exec(context.Background(), `DELETE FROM platform_role_bindings WHERE user_id = $1`, other); err != nil {
				t.Fatal(err)
			}
		}
	}
}
