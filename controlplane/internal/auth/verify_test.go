package auth

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// claimsAt are valid API claims for user, issued at now.
func (f *fixture) claimsAt(user uuid.UUID, now time.Time) accessClaims {
	iat, exp := now.Unix(), now.Add(f.cfg.AccessTokenTTL).Unix()
	return accessClaims{
		Issuer: f.cfg.Issuer, Audience: audience{f.cfg.Audience}, Subject: user.String(),
		IssuedAt: &iat, NotBefore: &iat, Expiry: &exp, JWTID: uuid.NewString(), Scope: ScopeAPI,
		Username: "alice", PlatformRoles: []string{principal.RoleUser}, RoleSource: principal.RoleSourceBindings,
	}
}

func (f *fixture) sign(t *testing.T, c accessClaims) string {
	t.Helper()
	key, err := f.keys.signer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tok, err := signClaims(key, c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func b64(v any) string {
	b, _ := json.Marshal(v)
	return base64.RawURLEncoding.EncodeToString(b)
}

// hs256 forges a token signed with HMAC-SHA256 under secret (the key-confusion attack).
func hs256(hdr map[string]any, c accessClaims, secret []byte) string {
	input := b64(hdr) + "." + b64(c)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(input))
	return input + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

func TestAuthenticateCodes(t *testing.T) {
	f := newFixture(t)
	user := uuid.Must(uuid.NewV7())
	kid := f.keys.ActiveKID()
	valid := f.sign(t, f.claimsAt(user, t0))

	pub, _ := f.keys.verificationKey(kid, t0)
	pkix, _ := x509.MarshalPKIXPublicKey(pub)
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pkix})
	jwkJSON, _ := publicJWK(kid, pub)

	otherKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	forged, _ := signClaims(&activeKey{kid: kid, priv: otherKey}, f.claimsAt(user, t0))

	with := func(mod func(c *accessClaims)) string {
		c := f.claimsAt(user, t0)
		mod(&c)
		return f.sign(t, c)
	}
	parts := strings.Split(valid, ".")
	sig := []byte(parts[2])
	sig[10] ^= 0x01
	tampered := parts[0] + "." + parts[1] + "." + string(sig)
	payloadSwap := parts[0] + "." + b64(func() accessClaims {
		c := f.claimsAt(user, t0)
		c.PlatformRoles = []string{principal.RoleSuperadmin}
		return c
	}()) + "." + parts[2]

	cases := []struct {
		name   string
		header string // full Authorization header; "" = none
		query  string
		want   apierr.Code
	}{
		{name: "valid", header: "Bearer " + valid},
		{name: "scheme is case-insensitive", header: "bearer " + valid},
		{name: "no header", want: apierr.TokenMissing},
		{name: "empty bearer", header: "Bearer ", want: apierr.TokenMissing},
		{name: "basic scheme", header: "Basic dXNlcjpwYXNz", want: apierr.TokenMissing},
		{name: "query string is ignored", query: "?access_token=" + valid, want: apierr.TokenMissing},
		{name: "malformed", header: "Bearer not-a-jwt", want: apierr.TokenInvalid},
		{name: "malformed header json", header: "Bearer e30x.e30.e30", want: apierr.TokenInvalid},
		{name: "bad signature", header: "Bearer " + tampered, want: apierr.TokenInvalid},
		{name: "payload swapped", header: "Bearer " + payloadSwap, want: apierr.TokenInvalid},
		{name: "signed by another key with our kid", header: "Bearer " + forged, want: apierr.TokenInvalid},
		{name: "alg none", header: "Bearer " + b64(map[string]any{"alg": "none", "kid": kid, "typ": "JWT"}) + "." + b64(f.claimsAt(user, t0)) + ".", want: apierr.TokenInvalid},
		{name: "HS256 keyed with the public key PEM", header: "Bearer " + hs256(map[string]any{"alg": "HS256", "kid": kid}, f.claimsAt(user, t0), pemKey), want: apierr.TokenInvalid},
		{name: "HS256 keyed with the public key DER", header: "Bearer " + hs256(map[string]any{"alg": "HS256", "kid": kid}, f.claimsAt(user, t0), pkix), want: apierr.TokenInvalid},
		{name: "HS256 keyed with the public JWK", header: "Bearer " + hs256(map[string]any{"alg": "HS256", "kid": kid}, f.claimsAt(user, t0), jwkJSON), want: apierr.TokenInvalid},
		{name: "unknown kid", header: "Bearer " + hs256(map[string]any{"alg": "RS256", "kid": uuid.NewString()}, f.claimsAt(user, t0), nil), want: apierr.TokenInvalid},
		{name: "wrong issuer", header: "Bearer " + with(func(c *accessClaims) { c.Issuer = "evil" }), want: apierr.TokenInvalid},
		{name: "wrong audience", header: "Bearer " + with(func(c *accessClaims) { c.Audience = audience{"other-api"} }), want: apierr.TokenInvalid},
		{name: "audience array containing ours", header: "Bearer " + with(func(c *accessClaims) { c.Audience = audience{"other", f.cfg.Audience} })},
		{name: "no exp", header: "Bearer " + with(func(c *accessClaims) { c.Expiry = nil }), want: apierr.TokenInvalid},
		{name: "bad sub", header: "Bearer " + with(func(c *accessClaims) { c.Subject = "alice" }), want: apierr.TokenInvalid},
		{name: "expired within leeway", header: "Bearer " + with(func(c *accessClaims) { c.Expiry = ptr(t0.Add(-29 * time.Second).Unix()) })},
		{name: "expired at leeway", header: "Bearer " + with(func(c *accessClaims) { c.Expiry = ptr(t0.Add(-30 * time.Second).Unix()) }), want: apierr.TokenExpired},
		{name: "expired beyond leeway", header: "Bearer " + with(func(c *accessClaims) { c.Expiry = ptr(t0.Add(-time.Hour).Unix()) }), want: apierr.TokenExpired},
		{name: "nbf within leeway", header: "Bearer " + with(func(c *accessClaims) { c.NotBefore = ptr(t0.Add(29 * time.Second).Unix()) })},
		{name: "nbf beyond leeway", header: "Bearer " + with(func(c *accessClaims) { c.NotBefore = ptr(t0.Add(time.Minute).Unix()) }), want: apierr.TokenInvalid},
		{name: "refresh scope", header: "Bearer " + with(func(c *accessClaims) { c.Scope = "refresh" }), want: apierr.TokenScopeInvalid},
		{name: "terminal scope", header: "Bearer " + with(func(c *accessClaims) { c.Scope = "terminal" }), want: apierr.TokenScopeInvalid},
		{name: "no scope", header: "Bearer " + with(func(c *accessClaims) { c.Scope = "" }), want: apierr.TokenScopeInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/api/v1/me"+tc.query, nil)
			if tc.header != "" {
				r.Header.Set("Authorization", tc.header)
			}
			p, err := f.authn.Authenticate(r)
			wantCode(t, err, tc.want)
			if tc.want != "" {
				e, _ := apierr.As(err)
				if e.HTTPStatus() != 401 {
					t.Errorf("status = %d, want 401", e.HTTPStatus())
				}
				if strings.Contains(e.Message, valid) || strings.Contains(e.Message, "kid") {
					t.Errorf("message %q is not user-safe", e.Message)
				}
				return
			}
			if p.UserID != user || p.Username != "alice" {
				t.Errorf("principal = %+v", p)
			}
		})
	}

	t.Run("expiry follows the clock", func(t *testing.T) {
		tok := f.sign(t, f.claimsAt(user, t0))
		f.clock.Set(t0.Add(f.cfg.AccessTokenTTL + 29*time.Second))
		wantCode(t, f.authenticate(tok), "")
		f.clock.Set(t0.Add(f.cfg.AccessTokenTTL + 31*time.Second))
		wantCode(t, f.authenticate(tok), apierr.TokenExpired)
		f.clock.Set(t0)
	})
	t.Run("two Authorization headers", func(t *testing.T) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Add("Authorization", "Bearer "+valid)
		r.Header.Add("Authorization", "Bearer "+valid)
		_, err := f.authn.Authenticate(r)
		wantCode(t, err, apierr.TokenInvalid)
	})
}

func TestIssuedTokenCarriesPrincipalFacts(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	cases := []struct {
		name      string
		opts      userOpts
		wantRoles []string
		wantSrc   string
		wantCaps  []string
	}{
		{"admin user is superadmin (binding from users.role, migration 00550)", userOpts{role: "admin"}, []string{principal.RoleSuperadmin}, principal.RoleSourceBindings, principal.CapabilitiesFor([]string{principal.RoleSuperadmin})},
		{"ops binding", userOpts{tenant: true, bindings: []string{principal.RoleOps}}, []string{principal.RoleOps}, principal.RoleSourceBindings, principal.CapabilitiesFor([]string{principal.RoleOps})},
		{"no binding is platform_user", userOpts{tenant: true}, []string{principal.RoleUser}, principal.RoleSourceBindings, []string{}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name := "user" + string(rune('a'+i))
			id := f.createUser(t, name, tc.opts)
			toks, err := f.svc.IssueFor(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest("GET", "/", nil)
			r.Header.Set("Authorization", "Bearer "+toks.AccessToken)
			p, err := f.authn.Authenticate(r)
			if err != nil {
				t.Fatal(err)
			}
			if p.UserID != id || p.Username != name || !slices.Equal(p.PlatformRole, tc.wantRoles) || p.RoleSource != tc.wantSrc || !slices.Equal(p.Capabilities, tc.wantCaps) {
				t.Errorf("principal = %+v", p)
			}
			if tc.opts.tenant != (p.TenantID != uuid.Nil) || (tc.opts.tenant && p.TenantRole != "admin") {
				t.Errorf("tenant facts = %s %q", p.TenantID, p.TenantRole)
			}
			// The header names the active key and the claims are the documented ones.
			parts := strings.Split(toks.AccessToken, ".")
			var hdr, claims map[string]any
			hb, _ := base64.RawURLEncoding.DecodeString(parts[0])
			cb, _ := base64.RawURLEncoding.DecodeString(parts[1])
			_ = json.Unmarshal(hb, &hdr)
			_ = json.Unmarshal(cb, &claims)
			if hdr["alg"] != "RS256" || hdr["kid"] != f.keys.ActiveKID() {
				t.Errorf("header = %v", hdr)
			}
			for _, k := range []string{"iss", "aud", "sub", "iat", "nbf", "exp", "jti", "scope", "un", "trole", "proles", "psrc"} {
				if _, ok := claims[k]; !ok && (k != "trole" || tc.opts.tenant) {
					t.Errorf("claim %s missing: %v", k, claims)
				}
			}
			if _, ok := claims["tid"]; ok != tc.opts.tenant {
				t.Errorf("tid presence = %v, want %v", ok, tc.opts.tenant)
			}
			if claims["exp"].(float64)-claims["iat"].(float64) != f.cfg.AccessTokenTTL.Seconds() {
				t.Errorf("ttl = %v", claims["exp"].(float64)-claims["iat"].(float64))
			}
		})
	}
}
