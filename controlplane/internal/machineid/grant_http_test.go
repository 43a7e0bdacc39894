package machineid_test

import (
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/shared/clock"
)

// These tests drive service accounts, project access credentials and the
// client-credentials grant through the real server (every response validated against
// the contract), on a manual clock.

// answer is the whole answer of one request (apitest.Answer).
type answer = apitest.Answer

func send(t *testing.T, e *apitest.Env, req *http.Request) answer {
	t.Helper()
	return e.Send(t, req)
}

func call(t *testing.T, e *apitest.Env, method, path, token string, body any, project string) answer {
	t.Helper()
	return e.Call(t, method, path, token, body, project)
}

func count(t *testing.T, e *apitest.Env, query string, args ...any) int {
	t.Helper()
	return e.Count(t, query, args...)
}

// oathtool is the code an authenticator app shows for secret at now.
var oathtool = apitest.Oathtool

// grant posts a client-credentials request: form holds the body; basic, when set, is
// the client id and secret for HTTP Basic.
func grant(t *testing.T, e *apitest.Env, form url.Values, basic ...string) answer {
	t.Helper()
	req, err := http.NewRequest("POST", e.Server.URL+"/api/v1/auth/token", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if len(basic) == 2 {
		req.SetBasicAuth(url.QueryEscape(basic[0]), url.QueryEscape(basic[1]))
	}
	return send(t, e, req)
}

func creds(id, secret string) url.Values {
	return url.Values{"grant_type": {"client_credentials"}, "client_id": {id}, "client_secret": {secret}}
}

func want(t *testing.T, what string, a answer, status int, code string) {
	t.Helper()
	got := a.Str("code")
	if got == "" {
		got = a.Str("error")
	}
	if a.Status != status || got != code {
		t.Fatalf("%s: %d %s (%s) %s, want %d %s", what, a.Status, got, a.Reason(), a.Raw, status, code)
	}
}

type fixture struct {
	e          *apitest.Env
	clk        *clock.Manual
	adminTok   string
	ten        apitest.Tenant
	other      string // a second project of the tenant
	saID       string
	clientID   string
	secret     string
	credential string
}

// setup: a tenant with a second project, a service account that is member of the
// default project only, and one credential of it.
func setup(t *testing.T) fixture {
	clk := clock.NewManual(time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC))
	e := apitest.New(t, apitest.WithOptions(func(o *app.Options) { o.Clock = clk }))
	_, adminTok := e.PlatformAdmin(t)
	ten := e.NewTenant(t, adminTok, "Machines")
	p := call(t, e, "POST", "/api/v1/projects", ten.AdminToken, map[string]any{"name": "Other"}, "")
	want(t, "create project", p, 201, "")
	other := p.Body["project"].(map[string]any)["id"].(string)

	sa := call(t, e, "POST", "/api/v1/service-accounts", ten.AdminToken, map[string]any{
		"name": "ci", "description": "CI pipeline",
		"project_roles": []map[string]string{{"project_id": ten.DefaultProject.String(), "role": "member"}},
	}, "")
	want(t, "create service account", sa, 201, "")
	saID := sa.Str("id")
	c := call(t, e, "POST", "/api/v1/service-accounts/"+saID+"/credentials", ten.AdminToken, map[string]any{"name": "ci key"}, "")
	want(t, "create credential", c, 201, "")
	cred := c.Body
	return fixture{e: e, clk: clk, adminTok: adminTok, ten: ten, other: other, saID: saID,
		clientID: cred["client_id"].(string), secret: c.Str("client_secret"), credential: cred["id"].(string)}
}

// TestServiceAccountGrant: the secret is shown once and stored as its hash; the grant
// works with the form body and with Basic; the token acts in its project only, reaches
// no tenant-admin or platform operation and cannot step up; wrong secrets, other grant
// types, scopes and shapes get RFC 6749 errors and change nothing.
func TestServiceAccountGrant(t *testing.T) {
	f := setup(t)
	e := f.e

	// Shown once: stored as SHA-256 only, never listed.
	sum := sha256.Sum256([]byte(f.secret))
	if n := count(t, e, `SELECT count(*) FROM access_credentials WHERE client_id = $1 AND secret_hash = $2`, f.clientID, sum[:]); n != 1 {
		t.Fatal("the credential's secret is not stored as its SHA-256")
	}
	for _, path := range []string{"/api/v1/service-accounts", "/api/v1/admin/access-credentials"} {
		tok := f.ten.AdminToken
		if strings.Contains(path, "admin") {
			tok = f.adminTok
		}
		l := call(t, e, "GET", path, tok, nil, "")
		want(t, "list "+path, l, 200, "")
		if strings.Contains(l.Raw, f.secret) || strings.Contains(l.Raw, "client_secret") {
			t.Fatalf("%s shows the secret: %s", path, l.Raw)
		}
	}

	// A replay of the create (same Idempotency-Key) answers the same credential without
	// its secret: the secret is never stored, not even in the idempotency record.
	mk := func() answer {
		req := e.Request("POST", "/api/v1/service-accounts/"+f.saID+"/credentials", f.ten.AdminToken, `{"name":"replayed"}`)
		req.Header.Set("Idempotency-Key", "cred-1")
		return send(t, e, req)
	}
	first, replay := mk(), mk()
	want(t, "create with a key", first, 201, "")
	want(t, "replay", replay, 201, "")
	if replay.Str("id") != first.Str("id") || replay.Str("client_secret") != "[redacted]" || first.Str("client_secret") == "[redacted]" {
		t.Fatalf("replay: %s (first %s)", replay.Raw, first.Raw)
	}
	if n := count(t, e, `SELECT count(*) FROM idempotency_keys WHERE position($1::bytea in response_body) > 0`, []byte(first.Str("client_secret"))); n != 0 {
		t.Fatal("the idempotency record holds the secret")
	}

	// Form body and Basic.
	g := grant(t, e, creds(f.clientID, f.secret))
	want(t, "grant (form)", g, 200, "")
	if g.Str("token_type") != "Bearer" || g.Body["expires_in"] != 900.0 || g.Str("scope") != "api" || g.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("grant answer: %v %v", g.Body, g.Header)
	}
	tok := g.Str("access_token")
	want(t, "grant (Basic)", grant(t, e, url.Values{"grant_type": {"client_credentials"}}, f.clientID, f.secret), 200, "")
	if n := count(t, e, `SELECT count(*) FROM access_credentials WHERE client_id = $1 AND last_used_at = $2`, f.clientID, f.clk.Now()); n != 1 {
		t.Fatal("last_used_at was not recorded")
	}

	// Scope: its project only, with its role there.
	want(t, "own project", call(t, e, "GET", "/api/v1/allocations", tok, nil, f.ten.DefaultProject.String()), 200, "")
	want(t, "another project", call(t, e, "GET", "/api/v1/allocations", tok, nil, f.other), 403, "insufficient_permissions")
	want(t, "owner operation in its project", call(t, e, "DELETE", "/api/v1/projects/"+f.ten.DefaultProject.String(), tok, nil, ""), 403, "insufficient_permissions")
	want(t, "tenant-admin operation", call(t, e, "GET", "/api/v1/service-accounts", tok, nil, ""), 403, "insufficient_permissions")
	want(t, "tenant-member operation", call(t, e, "GET", "/api/v1/billing/balance", tok, nil, ""), 403, "insufficient_permissions")
	want(t, "admin operation", call(t, e, "GET", "/api/v1/admin/tenants", tok, nil, ""), 403, "admin_required")
	want(t, "admin credential list", call(t, e, "GET", "/api/v1/admin/access-credentials", tok, nil, ""), 403, "admin_required")
	want(t, "catalog (open to machines)", call(t, e, "GET", "/api/v1/catalog/skus", tok, nil, ""), 200, "")
	// Never step-up: the operation refuses machines, so no MFA claim can be minted.
	su := call(t, e, "POST", "/api/v1/auth/step-up", tok, map[string]string{"totp_code": "123456"}, "")
	want(t, "step-up", su, 403, "insufficient_permissions")
	want(t, "TOTP enrolment", call(t, e, "POST", "/api/v1/account/security/mfa/totp", tok, nil, ""), 403, "insufficient_permissions")
	if n := count(t, e, `SELECT count(*) FROM auth_totp_factors`); n != 0 {
		t.Fatal("a machine identity enrolled a factor")
	}
	// The secret is not a bearer.
	want(t, "secret as bearer", call(t, e, "GET", "/api/v1/catalog/skus", f.secret, nil, ""), 401, "token_scope_invalid")

	// Refusals: RFC 6749 errors, nothing persisted.
	before := count(t, e, `SELECT count(*) FROM audit_events`)
	wrong := grant(t, e, creds(f.clientID, f.secret[:len(f.secret)-2]+"xx"))
	want(t, "wrong secret", wrong, 401, "invalid_client")
	if !strings.HasPrefix(wrong.Header.Get("WWW-Authenticate"), "Basic") {
		t.Fatalf("invalid_client without a Basic challenge: %v", wrong.Header)
	}
	want(t, "unknown client", grant(t, e, creds("gci_00000000000000000000000000000000", f.secret)), 401, "invalid_client")
	want(t, "no client", grant(t, e, url.Values{"grant_type": {"client_credentials"}}), 401, "invalid_client")
	want(t, "password grant", grant(t, e, url.Values{"grant_type": {"password"}, "username": {"x"}, "password": {"y"}}), 400, "unsupported_grant_type")
	want(t, "authorization_code grant", grant(t, e, url.Values{"grant_type": {"authorization_code"}, "code": {"x"}}), 400, "unsupported_grant_type")
	want(t, "no grant_type", grant(t, e, url.Values{"client_id": {f.clientID}}), 400, "invalid_request")
	sc := creds(f.clientID, f.secret)
	sc.Set("scope", "admin")
	want(t, "scope beyond the credential", grant(t, e, sc), 400, "invalid_scope")
	jreq := e.Request("POST", "/api/v1/auth/token", "", `{"grant_type":"client_credentials"}`)
	// Not a form: the contract refuses it before the grant runs, in the envelope (documented).
	want(t, "JSON body", send(t, e, jreq), 422, "validation_error")
	want(t, "body and Basic", grant(t, e, creds(f.clientID, f.secret), f.clientID, f.secret), 400, "invalid_request")
	if after := count(t, e, `SELECT count(*) FROM audit_events`); after != before {
		t.Fatalf("refused grants wrote %d audit rows", after-before)
	}
	if n := count(t, e, `SELECT count(*) FROM access_credentials WHERE client_id = $1 AND last_used_at = $2`, f.clientID, f.clk.Now()); n != 1 {
		t.Fatal("a refused grant touched the credential")
	}
}

// TestGrantBackoffExpiryAndDeletion: guessing is limited per client id; an expired
// credential and a deleted service account's credential are refused at once, while a
// token issued before stays valid until its exp.
func TestGrantBackoffExpiryAndDeletion(t *testing.T) {
	f := setup(t)
	e := f.e
	// The sign-in backoff's defaults: the fifth failure locks the client id for 1 s.
	for i := 0; i < 5; i++ {
		want(t, fmt.Sprintf("wrong secret %d", i), grant(t, e, creds(f.clientID, "gcs_wrong")), 401, "invalid_client")
	}
	locked := grant(t, e, creds(f.clientID, f.secret))
	want(t, "right secret while locked", locked, 429, "invalid_client")
	if locked.Header.Get("Retry-After") == "" {
		t.Fatal("429 without Retry-After")
	}
	f.clk.Advance(2 * time.Second)
	want(t, "after the lock", grant(t, e, creds(f.clientID, f.secret)), 200, "")

	// Expiry.
	exp := f.clk.Now().Add(time.Hour).Format(time.RFC3339)
	c := call(t, e, "POST", "/api/v1/service-accounts/"+f.saID+"/credentials", f.ten.AdminToken, map[string]any{"name": "short", "expires_at": exp}, "")
	want(t, "credential with expiry", c, 201, "")
	shortID, shortSecret := c.Str("client_id"), c.Str("client_secret")
	want(t, "before expiry", grant(t, e, creds(shortID, shortSecret)), 200, "")
	want(t, "blank name", call(t, e, "POST", "/api/v1/service-accounts/"+f.saID+"/credentials", f.ten.AdminToken, map[string]any{"name": "   "}, ""), 422, "validation_error")
	want(t, "expiry in the past", call(t, e, "POST", "/api/v1/service-accounts/"+f.saID+"/credentials", f.ten.AdminToken,
		map[string]any{"name": "past", "expires_at": f.clk.Now().Add(-time.Minute).Format(time.RFC3339)}, ""), 422, "validation_error")
	f.clk.Advance(time.Hour)
	want(t, "expired credential", grant(t, e, creds(shortID, shortSecret)), 401, "invalid_client")

	// Deleting the service account revokes its credentials for new tokens at once.
	admin := e.Login(t, f.ten.AdminUsername, apitest.Password) // the first one has expired
	g := grant(t, e, creds(f.clientID, f.secret))
	want(t, "grant", g, 200, "")
	want(t, "delete service account", call(t, e, "DELETE", "/api/v1/service-accounts/"+f.saID, admin, nil, ""), 204, "")
	want(t, "grant after deletion", grant(t, e, creds(f.clientID, f.secret)), 401, "invalid_client")
	want(t, "issued token until its exp", call(t, e, "GET", "/api/v1/allocations", g.Str("access_token"), nil, f.ten.DefaultProject.String()), 200, "")
	f.clk.Advance(15*time.Minute + time.Minute)
	want(t, "issued token after its exp", call(t, e, "GET", "/api/v1/allocations", g.Str("access_token"), nil, f.ten.DefaultProject.String()), 401, "token_expired")
	admin = e.Login(t, f.ten.AdminUsername, apitest.Password)
	want(t, "delete again", call(t, e, "DELETE", "/api/v1/service-accounts/"+f.saID, admin, nil, ""), 404, "invalid_request")
}

// TestProjectAccessCredential: bound to one project with its role; refused elsewhere;
// concurrent revocations revoke once; revocation is at once for new tokens.
func TestProjectAccessCredential(t *testing.T) {
	f := setup(t)
	e := f.e
	proj := f.ten.DefaultProject.String()
	base := "/api/v1/projects/" + proj + "/access-credentials"
	want(t, "owner role refused", call(t, e, "POST", base, f.ten.AdminToken, map[string]any{"name": "x", "role": "owner"}, ""), 422, "validation_error")
	want(t, "blank name", call(t, e, "POST", base, f.ten.AdminToken, map[string]any{"name": " ", "role": "viewer"}, ""), 422, "validation_error")
	c := call(t, e, "POST", base, f.ten.AdminToken, map[string]any{"name": "deploy", "role": "viewer"}, "")
	want(t, "create", c, 201, "")
	cred := c.Body
	if cred["kind"] != "project" || cred["role"] != "viewer" || cred["project_id"] != proj || cred["status"] != "active" {
		t.Fatalf("credential: %v", cred)
	}
	id, clientID, secret := cred["id"].(string), cred["client_id"].(string), c.Str("client_secret")
	l := call(t, e, "GET", base, f.ten.AdminToken, nil, "")
	want(t, "list", l, 200, "")
	if strings.Contains(l.Raw, secret) || len(l.Body["items"].([]any)) != 1 {
		t.Fatalf("list: %s", l.Raw)
	}

	g := grant(t, e, creds(clientID, secret))
	want(t, "grant", g, 200, "")
	tok := g.Str("access_token")
	want(t, "its project", call(t, e, "GET", "/api/v1/allocations", tok, nil, proj), 200, "")
	want(t, "its project by path", call(t, e, "GET", "/api/v1/projects/"+proj, tok, nil, ""), 200, "")
	want(t, "another project", call(t, e, "GET", "/api/v1/projects/"+f.other, tok, nil, ""), 403, "insufficient_permissions")
	want(t, "beyond its role", call(t, e, "GET", base, tok, nil, ""), 403, "insufficient_permissions")
	want(t, "other project's credentials path", call(t, e, "DELETE", "/api/v1/projects/"+f.other+"/access-credentials/"+id, f.ten.AdminToken, nil, ""), 404, "invalid_request")

	// Concurrent revocations: every one answers 204, one revokes.
	var wg sync.WaitGroup
	statuses := make([]int, 8)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := e.Request("DELETE", base+"/"+id, f.ten.AdminToken, "")
			resp := e.Do(req)
			statuses[i] = resp.StatusCode
			_ = resp.Body.Close()
		}()
	}
	wg.Wait()
	for i, s := range statuses {
		if s != 204 {
			t.Fatalf("revocation %d: %d", i, s)
		}
	}
	if n := count(t, e, `SELECT count(*) FROM audit_events WHERE action = 'access_credential.revoke' AND target_id = $1`, id); n != 1 {
		t.Fatalf("%d revocation audit rows, want 1", n)
	}
	want(t, "grant after revocation", grant(t, e, creds(clientID, secret)), 401, "invalid_client")
	l = call(t, e, "GET", "/api/v1/admin/access-credentials?status=revoked", f.adminTok, nil, "")
	want(t, "admin list revoked", l, 200, "")
	if items := l.Body["items"].([]any); len(items) != 1 || items[0].(map[string]any)["id"] != id {
		t.Fatalf("admin list of revoked: %s", l.Raw)
	}
	// The admin revocation is a sensitive IAM operation: step-up first.
	want(t, "admin revoke without step-up", call(t, e, "DELETE", "/api/v1/admin/access-credentials/"+f.credential, f.adminTok, nil, ""), 403, "step_up_required")
	want(t, "still usable", grant(t, e, creds(f.clientID, f.secret)), 200, "")

	// With a step-up token (TOTP codes from oathtool, the authenticator Debian ships) the
	// platform admin revokes it, and the next grant is refused.
	en := call(t, e, "POST", "/api/v1/account/security/mfa/totp", f.adminTok, nil, "")
	want(t, "admin enrols TOTP", en, 201, "")
	secretB32 := en.Str("secret")
	want(t, "admin verifies TOTP", call(t, e, "POST", "/api/v1/account/security/mfa/totp/verify", f.adminTok,
		map[string]string{"totp_code": oathtool(t, secretB32, f.clk.Now())}, ""), 200, "")
	f.clk.Advance(30 * time.Second)
	su := call(t, e, "POST", "/api/v1/auth/step-up", f.adminTok, map[string]string{"totp_code": oathtool(t, secretB32, f.clk.Now())}, "")
	want(t, "admin steps up", su, 200, "")
	want(t, "admin revoke with step-up", call(t, e, "DELETE", "/api/v1/admin/access-credentials/"+f.credential, su.Str("access_token"), nil, ""), 204, "")
	want(t, "grant after admin revocation", grant(t, e, creds(f.clientID, f.secret)), 401, "invalid_client")
	want(t, "admin revoke again", call(t, e, "DELETE", "/api/v1/admin/access-credentials/"+f.credential, su.Str("access_token"), nil, ""), 204, "")
	want(t, "admin revoke unknown", call(t, e, "DELETE", "/api/v1/admin/access-credentials/01936b2e-7c4a-7d2e-9f1a-3b5c7d9e1f20", su.Str("access_token"), nil, ""), 404, "invalid_request")
}
