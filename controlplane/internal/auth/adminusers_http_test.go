package auth_test

import (
	"net/url"
	"testing"

	"github.com/google/uuid"
)

// listAll pages through GET /api/v1/admin/users?query with page_size 2 and returns the
// ids in order.
func listAll(t *testing.T, call func(path string) answer, query url.Values) []string {
	t.Helper()
	var ids []string
	query.Set("page_size", "2")
	for page := 0; ; page++ {
		if page > 50 {
			t.Fatal("pagination does not end")
		}
		a := call("/api/v1/admin/users?" + query.Encode())
		if a.Status != 200 {
			t.Fatalf("list %s: %d %v", query.Encode(), a.Status, a.Body)
		}
		for _, it := range a.Body["items"].([]any) {
			ids = append(ids, it.(map[string]any)["id"].(string))
		}
		next, _ := a.Body["pagination"].(map[string]any)["next_cursor"].(string)
		if next == "" {
			return ids
		}
		query.Set("cursor", next)
	}
}

// TestAdminUsers: list with filters and cursors, get, disable (sign-in and refresh
// refused at once, audited), enable, the self and last-superadmin guards, and an MFA
// reset that needs step-up.
func TestAdminUsers(t *testing.T) {
	e, clk := newMFAEnv(t)
	adminID, adminTok, stepTok := steppedUpAdmin(t, e, clk)
	acme := e.NewTenant(t, adminTok, "Acme")
	globex := e.NewTenant(t, adminTok, "Globex")
	memberID, _ := e.NewUser(t, acme.AdminToken, "member")
	as := func(tok string) func(string) answer {
		return func(path string) answer { return call(t, e, "GET", path, tok, nil) }
	}

	want(t, "list as a tenant admin", call(t, e, "GET", "/api/v1/admin/users", acme.AdminToken, nil), 403, "admin_required", "")
	want(t, "patch as a tenant admin with an empty body", call(t, e, "PATCH", "/api/v1/admin/users/"+memberID.String(), acme.AdminToken, map[string]any{}), 403, "admin_required", "")

	// Every user once, in id order, across pages.
	all := listAll(t, as(adminTok), url.Values{})
	if n := count(t, e, `SELECT count(*) FROM users`); len(all) != n || n != 4 {
		t.Fatalf("listed %d users over pages, the table has %d (want 4)", len(all), n)
	}
	seen := map[string]bool{}
	for i, id := range all {
		if seen[id] || (i > 0 && all[i-1] >= id) {
			t.Fatalf("ids not unique and ascending: %v", all)
		}
		seen[id] = true
	}
	if got := listAll(t, as(adminTok), url.Values{"tenant_id": {acme.ID.String()}}); len(got) != 2 {
		t.Fatalf("acme users: %v", got)
	}
	if got := listAll(t, as(adminTok), url.Values{"q": {globex.AdminUsername[3:]}}); len(got) != 1 || got[0] != globex.AdminID.String() {
		t.Fatalf("q=%s: %v", globex.AdminUsername[3:], got)
	}
	if got := listAll(t, as(adminTok), url.Values{"q": {"PLATFORM ADM"}}); len(got) != 1 || got[0] != adminID.String() {
		t.Fatalf("q by display name, any case: %v", got)
	}
	if got := listAll(t, as(adminTok), url.Values{"q": {"%"}}); len(got) != 0 {
		t.Fatalf("q=%% is a literal, not a wildcard: %v", got)
	}
	want(t, "forged cursor", call(t, e, "GET", "/api/v1/admin/users?cursor=abc.def", adminTok, nil), 400, "invalid_request", "")

	g := call(t, e, "GET", "/api/v1/admin/users/"+memberID.String(), adminTok, nil)
	want(t, "get", g, 200, "", "")
	if g.Body["tenant_id"] != acme.ID.String() || g.Body["status"] != "active" || g.Body["mfa_enabled"] != false || g.Body["role"] != "user" {
		t.Fatalf("get: %v", g.Body)
	}
	want(t, "get unknown", call(t, e, "GET", "/api/v1/admin/users/"+uuid.NewString(), adminTok, nil), 404, "user_not_found", "")

	// Disable: sign-in and the refresh token refused at once.
	lg := login(t, e, g.Body["username"].(string), nil)
	want(t, "member signs in", lg, 200, "", "")
	refresh := lg.Body["refresh_token"].(string)
	// A second session, never presented while disabled: only the revocation at disable
	// time can end it (a refresh of a disabled user also revokes its own family).
	lgB := login(t, e, g.Body["username"].(string), nil)
	want(t, "member signs in again", lgB, 200, "", "")
	refreshB := lgB.Body["refresh_token"].(string)
	path := "/api/v1/admin/users/" + memberID.String()
	d := call(t, e, "PATCH", path, adminTok, map[string]any{"status": "disabled"})
	want(t, "disable", d, 200, "", "")
	if d.Body["status"] != "disabled" {
		t.Fatalf("disable: %v", d.Body)
	}
	want(t, "refresh of a disabled user", call(t, e, "POST", "/api/v1/auth/refresh", "", map[string]string{"refresh_token": refresh}), 401, "token_invalid", "")
	want(t, "sign-in of a disabled user", login(t, e, g.Body["username"].(string), nil), 401, "token_invalid", "")
	if got := listAll(t, as(adminTok), url.Values{"status": {"disabled"}}); len(got) != 1 || got[0] != memberID.String() {
		t.Fatalf("status=disabled: %v", got)
	}
	if n := count(t, e, `SELECT count(*) FROM audit_events WHERE action = 'user.disable' AND target_id = $1`, memberID.String()); n != 1 {
		t.Fatalf("%d disable audit rows", n)
	}
	// Enable: sign-in works again; the old session stays revoked.
	want(t, "enable", call(t, e, "PATCH", path, adminTok, map[string]any{"status": "active"}), 200, "", "")
	lg2 := login(t, e, g.Body["username"].(string), nil)
	want(t, "sign-in after enable", lg2, 200, "", "")
	want(t, "old refresh after enable", call(t, e, "POST", "/api/v1/auth/refresh", "", map[string]string{"refresh_token": refresh}), 401, "token_invalid", "")
	want(t, "other old session after enable", call(t, e, "POST", "/api/v1/auth/refresh", "", map[string]string{"refresh_token": refreshB}), 401, "token_invalid", "")
	if n := count(t, e, `SELECT count(*) FROM audit_events WHERE action = 'user.enable' AND target_id = $1`, memberID.String()); n != 1 {
		t.Fatalf("%d enable audit rows", n)
	}

	// Guards: yourself, and the last active superadmin.
	want(t, "disable yourself", call(t, e, "PATCH", "/api/v1/admin/users/"+adminID.String(), adminTok, map[string]any{"status": "disabled"}), 409, "invalid_request", "cannot_disable_self")
	otherID, otherTok := e.PlatformAdmin(t)
	want(t, "disable the first admin while another is active", call(t, e, "PATCH", "/api/v1/admin/users/"+adminID.String(), otherTok, map[string]any{"status": "disabled"}), 200, "", "")
	want(t, "disable the last active superadmin", call(t, e, "PATCH", "/api/v1/admin/users/"+otherID.String(), adminTok, map[string]any{"status": "disabled"}), 409, "invalid_request", "last_superadmin")
	want(t, "re-enable the first admin", call(t, e, "PATCH", "/api/v1/admin/users/"+adminID.String(), otherTok, map[string]any{"status": "active"}), 200, "", "")

	// MFA reset needs step-up.
	memberTok := lg2.Body["access_token"].(string)
	en := call(t, e, "POST", "/api/v1/account/security/mfa/totp", memberTok, nil)
	want(t, "member enrols", en, 201, "", "")
	want(t, "member verifies", call(t, e, "POST", "/api/v1/account/security/mfa/totp/verify", memberTok,
		map[string]string{"totp_code": oathtool(t, en.Body["secret"].(string), clk.Now())}), 200, "", "")
	want(t, "reset MFA without step-up", call(t, e, "PATCH", path, adminTok, map[string]any{"reset_mfa": true}), 403, "step_up_required", "")
	if n := count(t, e, `SELECT count(*) FROM auth_totp_factors WHERE user_id = $1 AND secret_enc IS NOT NULL`, memberID); n != 1 {
		t.Fatal("a refused MFA reset removed the factor")
	}
	r := call(t, e, "PATCH", path, stepTok, map[string]any{"reset_mfa": true})
	want(t, "reset MFA with step-up", r, 200, "", "")
	if r.Body["mfa_enabled"] != false {
		t.Fatalf("after reset: %v", r.Body)
	}
	if n := count(t, e, `SELECT count(*) FROM auth_totp_factors WHERE user_id = $1`, memberID) + count(t, e, `SELECT count(*) FROM auth_recovery_codes WHERE user_id = $1`, memberID); n != 0 {
		t.Fatal("factor or recovery codes left after the reset")
	}
	if n := count(t, e, `SELECT count(*) FROM audit_events WHERE action = 'user.mfa_reset' AND target_id = $1`, memberID.String()); n != 1 {
		t.Fatalf("%d mfa_reset audit rows", n)
	}
	want(t, "member signs in without a code after the reset", login(t, e, g.Body["username"].(string), nil), 200, "", "")
}
