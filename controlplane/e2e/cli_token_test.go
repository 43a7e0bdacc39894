package e2e_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/shared/clock"
)

// TestCLIRetriesAfterTokenExpired: the control plane's clock moves past the access
// token's expiry while the CLI's own record still calls it valid (its expiry is counted
// on the CLI's clock), so the request is answered 401 token_expired; the CLI refreshes
// (the refresh token rotates) and retries once, and the command succeeds. Once the refresh
// token has expired too, the CLI prints the re-login hint and exits 3, no stack trace.
func TestCLIRetriesAfterTokenExpired(t *testing.T) {
	clk := clock.NewManual(time.Now())
	e := apitest.New(t, apitest.WithOptions(func(o *app.Options) { o.Clock = clk }))
	_, adminToken := e.PlatformAdmin(t)
	tenant := e.NewTenant(t, adminToken, "Token Tenant")
	u := newCLIUser(t, e.Server.URL)
	if _, errOut, code := u.run(apitest.Password+"\n", "login", "-u", tenant.AdminUsername, "--password-stdin"); code != 0 {
		t.Fatalf("login: exit %d\n%s", code, errOut)
	}
	before := u.profileFile()

	clk.Advance(e.App.Config.Auth.AccessTokenTTL + time.Minute)
	// The server now refuses the stored access token: checked directly, so the retry
	// below is known to have been needed.
	if a := e.Call(t, "GET", "/api/v1/me", before["access_token"].(string), nil, ""); a.Status != 401 || a.Code() != "token_expired" {
		t.Fatalf("the stored token after the server's clock moved: %d %s, want 401 token_expired", a.Status, a.Code())
	}
	out := u.ok("whoami")
	if !strings.Contains(out, tenant.AdminUsername) {
		t.Fatalf("whoami after the retry:\n%s", out)
	}
	after := u.profileFile()
	if after["access_token"] == before["access_token"] || after["refresh_token"] == before["refresh_token"] {
		t.Fatal("the CLI did not refresh (access or refresh token unchanged)")
	}

	// Both tokens expired: a login hint, exit 3.
	clk.Advance(e.App.Config.Auth.RefreshTokenTTL + time.Hour)
	if errOut := u.fails(3, "", "whoami"); !strings.Contains(errOut, "gantry login") {
		t.Fatalf("expired login: no re-login hint:\n%s", errOut)
	}
}
