package server_test

import (
	"io"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
)

func TestAuthFailuresOverHTTP(t *testing.T) {
	e := apitest.New(t)
	_, adminTok := e.PlatformAdmin(t)

	expectError(t, e.Do(e.Request("GET", "/api/v1/me", "", "")), 401, "token_missing")
	expectError(t, e.Do(e.Request("GET", "/api/v1/me", "not.a.jwt", "")), 401, "token_invalid")
	// A bearer in the query string is never accepted.
	expectError(t, e.Do(e.Request("GET", "/api/v1/me?access_token="+adminTok, "", "")), 401, "token_missing")
	// Tampered signature.
	expectError(t, e.Do(e.Request("GET", "/api/v1/me", adminTok[:len(adminTok)-4]+"AAAA", "")), 401, "token_invalid")
	// Authentication comes before parameter checks (ARCHITECTURE §3 order).
	expectError(t, e.Do(e.Request("GET", "/api/v1/projects/not-a-uuid", "", "")), 401, "token_missing")
	// Admin operations need a platform admin.
	ten := e.NewTenant(t, adminTok, "Plain")
	expectError(t, e.Do(e.Request("GET", "/api/v1/admin/tenants", ten.AdminToken, "")), 403, "admin_required")
	resp := e.Do(e.Request("GET", "/api/v1/me", ten.AdminToken, ""))
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("valid token: %d", resp.StatusCode)
	}
}

func TestJWKSRefreshSwitch(t *testing.T) {
	off := apitest.New(t)
	expectError(t, off.Do(off.Request("POST", "/internal/auth/jwks/refresh", "anything", "")), 404, "invalid_request")

	on := apitest.New(t, apitest.WithConfig(func(c *app.Config) { c.Auth.InternalJWKSRefreshToken = "internal-secret-1" }))
	expectError(t, on.Do(on.Request("POST", "/internal/auth/jwks/refresh", "wrong", "")), 401, "token_invalid")
	expectError(t, on.Do(on.Request("POST", "/internal/auth/jwks/refresh", "", "")), 401, "token_invalid")
	resp := on.Do(on.Request("POST", "/internal/auth/jwks/refresh", "internal-secret-1", ""))
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"key_count":1`) {
		t.Fatalf("refresh: %d %s", resp.StatusCode, body)
	}
	resp = on.Do(on.Request("GET", "/.well-known/jwks.json", "", ""))
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"kty":"RSA"`) || strings.Contains(string(body), `"d":`) {
		t.Fatalf("jwks: %d %s", resp.StatusCode, body)
	}
}
