package proxy_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/proxy"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/clock"
)

// createAppProxySession through the API (the generated client against the real
// server): the contract's answer, then the code spent on the proxy of this test (one
// code bucket for every replica); the refusals of the operation.
func TestCreateAppProxySessionOperation(t *testing.T) {
	w := newWorld(t)
	node := w.agentNode(t)
	_, id := w.startApp(t, node)
	ctx := t.Context()
	alice := w.Client(w.Acme.AdminToken)
	params := &api.CreateAppProxySessionParams{XProjectID: w.Acme.DefaultProject}

	r, err := alice.CreateAppProxySessionWithResponse(ctx, id, params)
	if err != nil || r.JSON201 == nil {
		t.Fatalf("mint: %v %d %s", err, r.StatusCode(), r.Body)
	}
	s := r.JSON201
	if s.AppInstanceID != id || !strings.HasPrefix(s.URL, proxy.InstancePath(id)+"?gantry_proxy_code=") || time.Until(s.ExpiresAt) > time.Minute+time.Second {
		t.Fatalf("session %+v", s)
	}
	resp := do(t, &http.Client{CheckRedirect: noRedirect}, http.MethodGet, w.URL+s.URL, "", nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 {
		t.Fatalf("exchange of an API-minted code: %d %v", resp.StatusCode, resp.Cookies())
	}

	// Refusals: another tenant (its project header is refused first), an unknown
	// instance, an instance that is not running.
	globex := w.NewTenant(t, w.root, "Globex")
	if r, _ := w.Client(globex.AdminToken).CreateAppProxySessionWithResponse(ctx, id, params); r.StatusCode() != 403 {
		t.Errorf("another tenant: %d %s", r.StatusCode(), r.Body)
	}
	if r, _ := w.Client(globex.AdminToken).CreateAppProxySessionWithResponse(ctx, id, &api.CreateAppProxySessionParams{XProjectID: globex.DefaultProject}); r.StatusCode() != 404 {
		t.Errorf("another tenant in its own project: %d %s", r.StatusCode(), r.Body)
	}
	if r, _ := alice.CreateAppProxySessionWithResponse(ctx, uuid.New(), params); r.StatusCode() != 404 || !strings.Contains(string(r.Body), "app_instance_not_found") {
		t.Errorf("unknown instance: %d %s", r.StatusCode(), r.Body)
	}
	w.setState(t, id, "stopped")
	if r, _ := alice.CreateAppProxySessionWithResponse(ctx, id, params); r.StatusCode() != 409 || !strings.Contains(string(r.Body), "app_instance_state_invalid") {
		t.Errorf("stopped: %d %s", r.StatusCode(), r.Body)
	}
}

// A code past its 60 seconds is token_expired (and sets nothing); a cross-site
// navigation lands on a page that moves on, since a SameSite=Strict cookie would not
// follow a redirect chain that another site started.
func TestProxyExchangeExpiryAndCrossSite(t *testing.T) {
	w := newWorld(t)
	node := w.agentNode(t)
	_, id := w.startApp(t, node)
	clk := clock.NewManual(time.Now())
	p := w.newProxy(t, w.App, proxy.Config{AccessCacheTTL: -1}, clk)
	srv := httptest.NewServer(p.Mount(w.App.Handler))
	t.Cleanup(func() { p.Close(); srv.CloseClientConnections(); srv.Close() })
	prin := w.principalOf(t, w.Acme.AdminToken)
	proj, err := w.App.Tenancy.Access(t.Context(), prin, w.Acme.DefaultProject)
	if err != nil {
		t.Fatal(err)
	}
	plain := &http.Client{CheckRedirect: noRedirect}

	s, err := p.Mint(t.Context(), prin, proj, id)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(60 * time.Second)
	resp := do(t, plain, http.MethodGet, srv.URL+s.URL, "", nil)
	if len(resp.Cookies()) != 0 {
		t.Fatal("an expired code set a cookie")
	}
	wantEnvelope(t, resp, 401, "token_expired")

	s, err = p.Mint(t.Context(), prin, proj, id)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+s.URL, nil)
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err = plain.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body strings.Builder
	_, _ = io.Copy(&body, resp.Body)
	if resp.StatusCode != 200 || len(resp.Cookies()) != 1 || !strings.Contains(body.String(), `http-equiv="refresh" content="0;url=`+proxy.InstancePath(id)+`"`) {
		t.Fatalf("cross-site exchange: %d %v %q", resp.StatusCode, resp.Cookies(), body.String())
	}
}
