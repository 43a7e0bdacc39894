package auth_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
	zoidc "github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
	"golang.org/x/text/language"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
)

// These tests run enterprise sign-in against a real OpenID provider: zitadel/oidc's
// example provider (exampleop + its in-memory storage), served by httptest in the
// test. Its login form is driven with an HTTP client and a cookie jar, as a browser
// would.

const (
	idpClientID     = "gantry-web"
	idpClientSecret = "s3cret-of-the-client"
)

// idpUsers is the provider's user store: people of acme.example (one in the admins
// group), one of another domain and one whose email is not verified.
type idpUsers map[string]*storage.User

func (u idpUsers) GetUserByID(id string) *storage.User { return u[id] }
func (u idpUsers) GetUserByUsername(name string) *storage.User {
	for _, x := range u {
		if x.Username == name {
			return x
		}
	}
	return nil
}
func (u idpUsers) ExampleClientID() string { return "service" }

var idpGroups = map[string][]string{"alice": {"gantry-admins", "staff"}, "bob": {"staff"}}

// idpStorage is the example storage with email and groups asserted in the ID token
// (as Entra ID, Google and Okta do), not only at the userinfo endpoint.
type idpStorage struct{ *storage.Storage }

type idTokenClaimsClient struct{ op.Client }

func (idTokenClaimsClient) IDTokenUserinfoClaimsAssertion() bool { return true }

func (s idpStorage) GetClientByClientID(ctx context.Context, id string) (op.Client, error) {
	c, err := s.Storage.GetClientByClientID(ctx, id)
	if err != nil {
		return nil, err
	}
	return idTokenClaimsClient{c}, nil
}

func (s idpStorage) SetUserinfoFromScopes(ctx context.Context, ui *zoidc.UserInfo, userID, clientID string, scopes []string) error {
	if err := s.Storage.SetUserinfoFromScopes(ctx, ui, userID, clientID, scopes); err != nil {
		return err
	}
	if g, ok := idpGroups[userID]; ok {
		ui.AppendClaims("groups", g)
	}
	return nil
}

func (s idpStorage) SetUserinfoFromRequest(ctx context.Context, ui *zoidc.UserInfo, req op.IDTokenRequest, scopes []string) error {
	if err := s.Storage.SetUserinfoFromRequest(ctx, ui, req, scopes); err != nil {
		return err
	}
	if g, ok := idpGroups[req.GetSubject()]; ok {
		ui.AppendClaims("groups", g)
	}
	return nil
}

// startIdP serves the example provider and registers our client with redirectURL.
func startIdP(t *testing.T, redirectURL string) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	issuer := "http://" + srv.Listener.Addr().String()
	user := func(id, email string, verified bool) *storage.User {
		return &storage.User{ID: id, Username: id, Password: "verysecure", FirstName: id, LastName: "Example",
			Email: email, EmailVerified: verified, PreferredLanguage: language.English}
	}
	users := idpUsers{
		"alice":   user("alice", "alice@acme.example", true),
		"bob":     user("bob", "Bob@ACME.example", true),
		"mallory": user("mallory", "mallory@evil.example", true),
		"eve":     user("eve", "eve@acme.example", false),
		"owner":   user("owner", "owner@acme.example", true), // a personal account has this username
	}
	st := storage.NewStorageWithClients(users, map[string]*storage.Client{
		idpClientID: storage.WebClient(idpClientID, idpClientSecret, redirectURL),
	})
	srv.Config.Handler = exampleop.SetupServer(issuer, idpStorage{st}, nil, false)
	srv.Start()
	t.Cleanup(srv.Close)
	return issuer
}

// browser is a cookie-keeping client: gantry's answers go through the contract
// validator, the provider's do not.
type browser struct {
	jar    http.CookieJar
	gantry *http.Client
	idp    *http.Client
}

func newBrowser(t *testing.T, e *apitest.Env) *browser {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	stop := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	g := e.HTTPClient()
	g.Jar, g.CheckRedirect = jar, stop
	return &browser{jar: jar, gantry: g, idp: &http.Client{Jar: jar, CheckRedirect: stop}}
}

func (b *browser) get(t *testing.T, c *http.Client, u string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// start calls our start operation and returns the provider URL it redirects to.
func (b *browser) start(t *testing.T, e *apitest.Env, slug string) string {
	t.Helper()
	resp, body := b.get(t, b.gantry, e.Server.URL+"/api/v1/auth/oidc/"+slug+"/start")
	if resp.StatusCode != 302 {
		t.Fatalf("start: %d %s", resp.StatusCode, body)
	}
	loc := resp.Header.Get("Location")
	q, _ := url.Parse(loc)
	if q.Query().Get("code_challenge_method") != "S256" || q.Query().Get("nonce") == "" || q.Query().Get("state") == "" {
		t.Fatalf("start redirect lacks PKCE S256, nonce or state: %s", loc)
	}
	if !strings.Contains(resp.Header.Get("Set-Cookie"), "HttpOnly") {
		t.Fatalf("flow cookie: %q", resp.Header.Get("Set-Cookie"))
	}
	return loc
}

// login drives the provider from its authorize URL through its login form and returns
// the callback URL (ours) the provider redirects the browser to.
func (b *browser) login(t *testing.T, authURL, username string) string {
	t.Helper()
	u := authURL
	var authReqID string
	for i := 0; i < 5 && authReqID == ""; i++ {
		resp, body := b.get(t, b.idp, u)
		switch resp.StatusCode {
		case 302, 303:
			next, _ := resp.Request.URL.Parse(resp.Header.Get("Location"))
			u = next.String()
			authReqID = next.Query().Get("authRequestID")
		default:
			t.Fatalf("provider %s: %d %s", u, resp.StatusCode, body)
		}
	}
	if authReqID == "" {
		t.Fatal("the provider did not send the browser to its login page")
	}
	base, _ := url.Parse(authURL)
	form := url.Values{"id": {authReqID}, "username": {username}, "password": {"verysecure"}}
	resp, err := b.idp.PostForm(base.Scheme+"://"+base.Host+"/login/username", form)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for i := 0; i < 5; i++ {
		if resp.StatusCode != 302 && resp.StatusCode != 303 {
			t.Fatalf("provider login: %d", resp.StatusCode)
		}
		next, _ := resp.Request.URL.Parse(resp.Header.Get("Location"))
		if strings.Contains(next.Path, "/api/v1/auth/oidc/") {
			return next.String()
		}
		resp, _ = b.get(t, b.idp, next.String())
	}
	t.Fatal("the provider never redirected to the callback")
	return ""
}

// callback delivers the provider's redirect to our callback operation.
func (b *browser) callback(t *testing.T, cb string) answer {
	t.Helper()
	resp, body := b.get(t, b.gantry, cb)
	a := answer{Status: resp.StatusCode, Header: resp.Header, Body: map[string]any{}, Raw: body}
	if err := jsonUnmarshal(body, &a.Body); err != nil {
		t.Fatalf("callback: %d %s", resp.StatusCode, body)
	}
	return a
}

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }

// TestOIDCSignIn: configuration (discovery-checked, secret sealed and never returned),
// the happy path with just-in-time provisioning and the role mapping, later sign-ins,
// and every refusal of the callback (wrong, missing, reused, expired or foreign-browser
// state, two concurrent callbacks of one state), each leaving no user behind; then the sign-in
// mode errors through the real server.
func TestOIDCSignIn(t *testing.T) {
	e := apitest.New(t)
	_, adminTok := e.PlatformAdmin(t)
	acme := e.NewTenant(t, adminTok, "Acme")
	var slug string
	if err := e.Pool.QueryRow(context.Background(), `SELECT slug FROM tenants WHERE id = $1`, acme.ID).Scan(&slug); err != nil {
		t.Fatal(err)
	}
	redirectURL := e.Server.URL + "/api/v1/auth/oidc/" + slug + "/callback"
	issuer := startIdP(t, redirectURL)
	idpPath := "/api/v1/admin/tenants/" + acme.ID.String() + "/identity-provider"
	cfg := map[string]any{
		"issuer": issuer, "client_id": idpClientID, "client_secret": idpClientSecret, "redirect_url": redirectURL,
		"allowed_domains": []string{"ACME.example"}, "role_mapping": []map[string]string{{"value": "gantry-admins", "role": "admin"}},
	}

	// Configuration.
	want(t, "tenant admin configures", call(t, e, "PUT", idpPath, acme.AdminToken, cfg), 403, "admin_required", "")
	want(t, "start before configuration", call(t, e, "GET", "/api/v1/auth/oidc/"+slug+"/start", "", nil), 404, "invalid_request", "not_found")
	bad := map[string]any{}
	for k, v := range cfg {
		bad[k] = v
	}
	bad["issuer"] = "http://127.0.0.1:1"
	want(t, "an issuer that does not answer discovery", call(t, e, "PUT", idpPath, adminTok, bad), 422, "validation_error", "issuer_discovery_failed")
	if n := count(t, e, `SELECT count(*) FROM tenant_identity_providers`); n != 0 {
		t.Fatalf("a refused configuration was stored (%d rows)", n)
	}
	put := call(t, e, "PUT", idpPath, adminTok, cfg)
	want(t, "configure", put, 200, "", "")
	if _, ok := put.Body["client_secret"]; ok || put.Body["client_secret_set"] != true || put.Body["provider"] != slug {
		t.Fatalf("configure answer: %v", put.Body)
	}
	if n := count(t, e, `SELECT count(*) FROM tenant_identity_providers WHERE position($1::bytea IN client_secret_enc) > 0`, []byte(idpClientSecret)); n != 0 {
		t.Fatal("the client secret is stored in clear")
	}
	if n := count(t, e, `SELECT count(*) FROM audit_events WHERE action = 'tenant.identity_provider.update'`); n != 1 {
		t.Fatalf("configuration audited %d times", n)
	}
	want(t, "get", call(t, e, "GET", idpPath, adminTok, nil), 200, "", "")

	users := func() int { return count(t, e, `SELECT count(*) FROM users`) }
	before := users()
	start := "/api/v1/auth/oidc/" + slug + "/start"
	_ = start

	// Happy path: alice is provisioned as a tenant admin (gantry-admins → admin).
	b := newBrowser(t, e)
	cb := b.login(t, b.start(t, e, slug), "alice")
	ok := b.callback(t, cb)
	want(t, "alice signs in", ok, 200, "", "")
	tok := ok.Body["access_token"].(string)
	me := call(t, e, "GET", "/api/v1/me", tok, nil)
	want(t, "alice /me", me, 200, "", "")
	if me.Body["username"] != "alice@acme.example" || me.Body["org_id"] != acme.ID.String() {
		t.Fatalf("/me: %v", me.Body)
	}
	want(t, "alice, a tenant admin, lists the tenant's users", call(t, e, "GET", "/api/v1/users", tok, nil), 200, "", "")
	if n := count(t, e, `SELECT count(*) FROM users u JOIN auth_federated_identities f ON f.user_id = u.id
		WHERE u.username = 'alice@acme.example' AND u.tenant_role = 'admin' AND u.password_hash IS NULL AND f.issuer = $1 AND f.subject = 'alice'`, issuer); n != 1 {
		t.Fatal("alice was not provisioned as a federated tenant admin")
	}
	if users() != before+1 {
		t.Fatalf("users %d, want %d", users(), before+1)
	}
	if n := count(t, e, `SELECT count(*) FROM audit_events WHERE action IN ('user.provision', 'user.login') AND metadata->>'method' = 'oidc'`); n != 2 {
		t.Fatalf("sign-in audited %d times, want provision + login", n)
	}

	// The same callback again: the state is spent.
	want(t, "reused state", b.callback(t, cb), 401, "token_invalid", "state_invalid")

	// A later sign-in finds alice again (no second user).
	b = newBrowser(t, e)
	want(t, "alice again", b.callback(t, b.login(t, b.start(t, e, slug), "alice")), 200, "", "")
	if users() != before+1 {
		t.Fatal("a second sign-in provisioned a second user")
	}

	refused := func(what, username string, tamper func(cb string) string, browserFor func(*browser) *browser, reason string) {
		t.Helper()
		n := users()
		b := newBrowser(t, e)
		cb := b.login(t, b.start(t, e, slug), username)
		if tamper != nil {
			cb = tamper(cb)
		}
		want(t, what, browserFor(b).callback(t, cb), 401, "token_invalid", reason)
		if users() != n {
			t.Fatalf("%s: a user was created", what)
		}
	}
	same := func(b *browser) *browser { return b }
	withState := func(s string) func(string) string {
		return func(cb string) string {
			u, _ := url.Parse(cb)
			q := u.Query()
			q.Set("state", s)
			u.RawQuery = q.Encode()
			return u.String()
		}
	}
	refused("wrong state", "bob", withState("not-the-state"), same, "state_invalid")
	refused("no state", "bob", withState(""), same, "state_invalid")
	refused("another browser's callback", "bob", nil, func(*browser) *browser { return newBrowser(t, e) }, "state_invalid")
	refused("email domain not allowed", "mallory", nil, same, "email_domain_not_allowed")
	refused("email not verified", "eve", nil, same, "email_not_verified")

	// Wrong nonce: the provider answers with the nonce it was sent; the server kept
	// another one.
	n := users()
	b = newBrowser(t, e)
	authURL := b.start(t, e, slug)
	if _, err := e.Pool.Exec(context.Background(), `UPDATE auth_oidc_flows SET nonce = 'another-nonce'`); err != nil {
		t.Fatal(err)
	}
	want(t, "wrong nonce", b.callback(t, b.login(t, authURL, "bob")), 401, "token_invalid", "nonce_invalid")
	if users() != n {
		t.Fatal("wrong nonce: a user was created")
	}

	// An expired flow: the provider answered after the 10 minutes.
	n = users()
	b = newBrowser(t, e)
	authURL = b.start(t, e, slug)
	if _, err := e.Pool.Exec(context.Background(), `UPDATE auth_oidc_flows SET expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	want(t, "expired state", b.callback(t, b.login(t, authURL, "bob")), 401, "token_invalid", "state_invalid")
	if users() != n {
		t.Fatal("expired state: a user was created")
	}

	// The same callback delivered twice at once: the state is spent by exactly one.
	b = newBrowser(t, e)
	cb = b.login(t, b.start(t, e, slug), "alice")
	results := make(chan int, 2)
	for range 2 {
		go func() {
			resp, err := b.gantry.Get(cb)
			if err != nil {
				results <- 0
				return
			}
			resp.Body.Close()
			results <- resp.StatusCode
		}()
	}
	if a, c := <-results, <-results; a+c != 200+401 {
		t.Fatalf("concurrent callbacks with one state: %d and %d, want one 200 and one 401", a, c)
	}

	// Bob (staff only) is a member; his email's domain is matched without case.
	b = newBrowser(t, e)
	want(t, "bob signs in", b.callback(t, b.login(t, b.start(t, e, slug), "bob")), 200, "", "")
	if n := count(t, e, `SELECT count(*) FROM users WHERE username = 'bob@acme.example' AND tenant_role = 'member'`); n != 1 {
		t.Fatal("bob is not a member")
	}

	// Sign-in modes.
	want(t, "a federated user's password", call(t, e, "POST", "/api/v1/auth/login", "", map[string]string{"username": "alice@acme.example", "password": apitest.Password}), 403, "auth_enterprise_required", "")
	want(t, "the tenant's password user while password sign-in is off", login(t, e, acme.AdminUsername, nil), 403, "auth_personal_disabled", "")
	want(t, "a wrong password still says nothing of the mode", call(t, e, "POST", "/api/v1/auth/login", "", map[string]string{"username": acme.AdminUsername, "password": "wrong-password-1"}), 401, "token_invalid", "")
	cfg["password_sign_in"] = true
	want(t, "turn password sign-in on", call(t, e, "PUT", idpPath, adminTok, cfg), 200, "", "")
	want(t, "the tenant's password user signs in", login(t, e, acme.AdminUsername, nil), 200, "", "")

	// An enterprise sign-in onto a personal (password) account.
	if _, err := e.Pool.Exec(context.Background(), `INSERT INTO users (id, username, display_name, password_hash, created_at, updated_at)
		VALUES (gen_random_uuid(), 'owner@acme.example', 'Owner', 'x', now(), now())`); err != nil {
		t.Fatal(err)
	}
	n = users()
	b = newBrowser(t, e)
	want(t, "enterprise sign-in onto a password account", b.callback(t, b.login(t, b.start(t, e, slug), "owner")), 403, "auth_personal_required", "")
	if users() != n || count(t, e, `SELECT count(*) FROM auth_federated_identities WHERE subject = 'owner'`) != 0 {
		t.Fatal("the personal account was linked")
	}
	if _, err := e.Pool.Exec(context.Background(), `INSERT INTO tenants (id, name, slug, kind, created_at, updated_at)
		VALUES (gen_random_uuid(), 'Solo', 'solo-oidc', 'personal', now(), now())`); err != nil {
		t.Fatal(err)
	}
	want(t, "enterprise sign-in of a personal tenant", call(t, e, "GET", "/api/v1/auth/oidc/solo-oidc/start", "", nil), 403, "auth_personal_required", "")

	// Removal stops enterprise sign-in at once.
	want(t, "delete", call(t, e, "DELETE", idpPath, adminTok, nil), 204, "", "")
	want(t, "start after removal", call(t, e, "GET", "/api/v1/auth/oidc/"+slug+"/start", "", nil), 404, "invalid_request", "not_found")
	want(t, "get after removal", call(t, e, "GET", idpPath, adminTok, nil), 404, "invalid_request", "not_found")
}
