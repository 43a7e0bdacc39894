package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/op"
	"golang.org/x/text/language"
)

// Enterprise sign-in from the CLI against a real OpenID provider: zitadel/oidc's example
// provider (as controlplane/internal/auth's OIDC tests use it), served by httptest. The
// provider's login form is driven by an HTTP client with a cookie jar, as a browser would.

const (
	ssoClientID     = "gantry-cli-test"
	ssoClientSecret = "s3cret-of-the-cli-test"
)

type ssoUsers map[string]*storage.User

func (u ssoUsers) GetUserByID(id string) *storage.User { return u[id] }
func (u ssoUsers) GetUserByUsername(name string) *storage.User {
	for _, x := range u {
		if x.Username == name {
			return x
		}
	}
	return nil
}
func (u ssoUsers) ExampleClientID() string { return "service" }

// ssoStorage asserts the email in the ID token (the control plane reads it there).
type ssoStorage struct{ *storage.Storage }

type ssoIDTokenClaims struct{ op.Client }

func (ssoIDTokenClaims) IDTokenUserinfoClaimsAssertion() bool { return true }

func (s ssoStorage) GetClientByClientID(ctx context.Context, id string) (op.Client, error) {
	c, err := s.Storage.GetClientByClientID(ctx, id)
	if err != nil {
		return nil, err
	}
	return ssoIDTokenClaims{c}, nil
}

func startSSOProvider(t *testing.T, redirectURL string) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	issuer := "http://" + srv.Listener.Addr().String()
	users := ssoUsers{"alice": {ID: "alice", Username: "alice", Password: "verysecure", FirstName: "Alice", LastName: "Example",
		Email: "alice@acme.example", EmailVerified: true, PreferredLanguage: language.English}}
	st := storage.NewStorageWithClients(users, map[string]*storage.Client{
		ssoClientID: storage.WebClient(ssoClientID, ssoClientSecret, redirectURL),
	})
	srv.Config.Handler = exampleop.SetupServer(issuer, ssoStorage{st}, nil, false)
	srv.Start()
	t.Cleanup(srv.Close)
	return issuer
}

// ssoBrowser runs the whole sign-in from the start URL the CLI printed, as the user's
// browser does, and returns the page the callback answers.
func ssoBrowser(t *testing.T, startURL, username string) string {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(u string) (*http.Response, string) {
		resp, err := c.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	follow := func(resp *http.Response) *url.URL {
		if resp.StatusCode != 302 && resp.StatusCode != 303 {
			t.Fatalf("%s: %d, want a redirect", resp.Request.URL, resp.StatusCode)
		}
		next, err := resp.Request.URL.Parse(resp.Header.Get("Location"))
		if err != nil {
			t.Fatal(err)
		}
		return next
	}
	resp, _ := get(startURL)
	next := follow(resp)
	authReq := ""
	for i := 0; i < 5 && authReq == ""; i++ {
		resp, _ = get(next.String())
		next = follow(resp)
		authReq = next.Query().Get("authRequestID")
	}
	if authReq == "" {
		t.Fatal("the provider did not show its login page")
	}
	resp, err = c.PostForm(next.Scheme+"://"+next.Host+"/login/username",
		url.Values{"id": {authReq}, "username": {username}, "password": {"verysecure"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for i := 0; i < 5; i++ {
		next = follow(resp)
		if strings.Contains(next.Path, "/api/v1/auth/oidc/") {
			resp, body := get(next.String())
			if resp.StatusCode != 200 {
				t.Fatalf("callback: %d %s", resp.StatusCode, body)
			}
			return body
		}
		resp, _ = get(next.String())
	}
	t.Fatal("the provider never sent the browser to the callback")
	return ""
}

// TestCLILoginSSO: `gantry login --sso SLUG --no-browser` prints the tenant's start URL;
// the browser signs in at the provider and ends on the callback's token JSON; the user
// pastes it into the waiting CLI, which redeems the refresh token (so the browser's copy
// is dead) and is then signed in as the provisioned federated user. A password login of
// that user is refused with auth_enterprise_required and a hint naming --sso.
func TestCLILoginSSO(t *testing.T) {
	c := startCP(t)
	acme := c.env.NewTenant(t, c.admin, "Acme")
	var slug string
	if err := c.env.Pool.QueryRow(context.Background(), `SELECT slug FROM tenants WHERE id = $1`, acme.ID).Scan(&slug); err != nil {
		t.Fatal(err)
	}
	redirectURL := c.url + "/api/v1/auth/oidc/" + slug + "/callback"
	issuer := startSSOProvider(t, redirectURL)
	put := c.env.Call(t, "PUT", "/api/v1/admin/tenants/"+acme.ID.String()+"/identity-provider", c.admin, map[string]any{
		"issuer": issuer, "client_id": ssoClientID, "client_secret": ssoClientSecret, "redirect_url": redirectURL,
		"allowed_domains": []string{"acme.example"},
	}, "")
	if put.Status != 200 {
		t.Fatalf("configure the identity provider: %d %s", put.Status, put.Raw)
	}

	u := newCLIUser(t, c.url)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, u.bin, "login", "--sso", slug, "--no-browser", "--sso-token-stdin")
	cmd.Env = u.env()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The CLI prints the start URL and waits for the paste.
	wantStart := c.url + "/api/v1/auth/oidc/" + slug + "/start"
	lines := bufio.NewScanner(stderr)
	var printed strings.Builder
	for lines.Scan() {
		printed.WriteString(lines.Text() + "\n")
		if strings.TrimSpace(lines.Text()) == wantStart {
			break
		}
	}
	if !strings.Contains(printed.String(), wantStart) {
		t.Fatalf("the CLI did not print the start URL %s:\n%s", wantStart, printed.String())
	}
	page := ssoBrowser(t, wantStart, "alice")
	var shown struct {
		RefreshToken string `json:"refresh_token"`
	}
	if err := json.Unmarshal([]byte(page), &shown); err != nil || shown.RefreshToken == "" {
		t.Fatalf("callback page: %v %s", err, page)
	}
	// The whole page pasted, as a user copying it would.
	if _, err := io.WriteString(stdin, page+"\n"); err != nil {
		t.Fatal(err)
	}
	stdin.Close()
	rest, _ := io.ReadAll(stderr)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("gantry login --sso: %v\n%s%s", err, printed.String(), rest)
	}
	if !strings.Contains(string(rest), "Logged in to "+c.url+" as alice@acme.example") {
		t.Fatalf("login output:\n%s", rest)
	}
	if p := u.profileFile(); p["refresh_token"] == shown.RefreshToken || p["refresh_token"] == "" {
		t.Fatal("the CLI kept the refresh token shown in the browser instead of redeeming it")
	}
	var me struct {
		Username string `json:"username"`
	}
	if err := json.Unmarshal([]byte(u.ok("whoami", "-o", "json")), &me); err != nil || me.Username != "alice@acme.example" {
		t.Fatalf("whoami: %v %+v", err, me)
	}
	if a := c.env.Call(t, "POST", "/api/v1/auth/refresh", "", map[string]any{"refresh_token": shown.RefreshToken}, ""); a.Status != 401 {
		t.Fatalf("the browser's refresh token still works after the CLI redeemed it: %d %s", a.Status, a.Raw)
	}

	// A bare token pasted that is not a live one: the API's refusal, exit 3.
	bad := newCLIUser(t, c.url)
	out, errOut, code := bad.run("not-a-token\n", "login", "--sso", slug, "--no-browser", "--sso-token-stdin")
	if code != 3 || !strings.Contains(errOut, wantStart) {
		t.Fatalf("bogus token: exit %d\n%s%s", code, out, errOut)
	}

	// The federated user's password login is refused and the CLI says to use --sso.
	pw := newCLIUser(t, c.url)
	out, errOut, code = pw.run("a long enough password\n", "login", "-u", "alice@acme.example", "--password-stdin")
	if code != 4 || !strings.Contains(errOut, "code: auth_enterprise_required") || !strings.Contains(errOut, "gantry login --sso") {
		t.Fatalf("password login of a federated user: exit %d\n%s%s", code, out, errOut)
	}
}
