package auth

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	jose "github.com/go-jose/go-jose/v4"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

// TestVerifyIDToken checks the verifier configuration every callback uses (issuer,
// audience, expiry, algorithm allow-list, nonce) with ID tokens signed here: the real
// provider of TestOIDCSignIn signs only good RS256 tokens, so the refusals of a
// forged or foreign token are made by hand. The checks themselves are go-oidc's.
func TestVerifyIDToken(t *testing.T) {
	const iss, aud, nonce = "https://idp.example", "gantry-web", "n-0S6_WzA2Mj"
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	keys := &oidc.StaticKeySet{PublicKeys: []crypto.PublicKey{&rsaKey.PublicKey, &ecKey.PublicKey}}
	v := idTokenVerifier(iss, keys, aud, func() time.Time { return now })

	claims := func(mod func(map[string]any)) map[string]any {
		c := map[string]any{"iss": iss, "aud": aud, "sub": "alice", "nonce": nonce, "email": "alice@acme.example",
			"email_verified": true, "groups": []string{"gantry-admins"},
			"iat": now.Add(-time.Minute).Unix(), "exp": now.Add(5 * time.Minute).Unix()}
		if mod != nil {
			mod(c)
		}
		return c
	}
	sign := func(alg jose.SignatureAlgorithm, key any, c map[string]any) string {
		t.Helper()
		s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, nil)
		if err != nil {
			t.Fatal(err)
		}
		payload, _ := json.Marshal(c)
		obj, err := s.Sign(payload)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := obj.CompactSerialize()
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	unsigned := func(c map[string]any) string {
		h, _ := json.Marshal(map[string]string{"alg": "none", "typ": "JWT"})
		p, _ := json.Marshal(c)
		return base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(p) + "."
	}
	// HS256 with the RSA public key's bytes as the MAC key: the classic confusion attack.
	hmacKey := rsaKey.PublicKey.N.Bytes()

	ctx := context.Background()
	for _, tc := range []struct {
		name, raw, reason string
	}{
		{"RS256", sign(jose.RS256, rsaKey, claims(nil)), ""},
		{"ES256", sign(jose.ES256, ecKey, claims(nil)), ""},
		{"wrong issuer", sign(jose.RS256, rsaKey, claims(func(c map[string]any) { c["iss"] = "https://evil.example" })), "id_token_invalid"},
		{"wrong audience", sign(jose.RS256, rsaKey, claims(func(c map[string]any) { c["aud"] = "another-client" })), "id_token_invalid"},
		{"expired", sign(jose.RS256, rsaKey, claims(func(c map[string]any) { c["exp"] = now.Add(-time.Second).Unix() })), "id_token_invalid"},
		{"unexpected alg HS256", sign(jose.HS256, hmacKey, claims(nil)), "id_token_invalid"},
		{"unexpected alg RS384", sign(jose.RS384, rsaKey, claims(nil)), "id_token_invalid"},
		{"alg none", unsigned(claims(nil)), "id_token_invalid"},
		{"wrong nonce", sign(jose.RS256, rsaKey, claims(func(c map[string]any) { c["nonce"] = "another" })), "nonce_invalid"},
		{"no nonce", sign(jose.RS256, rsaKey, claims(func(c map[string]any) { delete(c, "nonce") })), "nonce_invalid"},
	} {
		got, err := verifyIDToken(ctx, v, tc.raw, nonce, "groups")
		if tc.reason == "" {
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if got.Subject != "alice" || got.Email != "alice@acme.example" || !got.EmailVerified || len(got.Roles) != 1 || got.Roles[0] != "gantry-admins" {
				t.Fatalf("%s: claims %+v", tc.name, got)
			}
			continue
		}
		e, ok := apierr.As(err)
		if !ok || e.Code != apierr.TokenInvalid || e.Details["reason"] != tc.reason {
			t.Fatalf("%s: err = %v, want token_invalid (%s)", tc.name, err, tc.reason)
		}
	}
}

func TestEmailDomainAndRoleMapping(t *testing.T) {
	for email, want := range map[string]bool{
		"a@acme.example": true, "a@ACME.Example": true, "a@sub.acme.example": false,
		"a@acme.example.evil": false, "acme.example": false, "a@": false, "@acme.example": false,
	} {
		if got := emailDomainAllowed(email, []string{"acme.example"}); got != want {
			t.Errorf("emailDomainAllowed(%q) = %v", email, got)
		}
	}
	m := map[string]string{"admins": "admin", "staff": "member"}
	if mappedRole(m, []string{"staff", "admins"}) != "admin" || mappedRole(m, []string{"staff"}) != "member" || mappedRole(m, nil) != "member" {
		t.Fatal("role mapping")
	}
}

func TestIdPSecretSealedPerTenant(t *testing.T) {
	k := testMasterKey(7)
	a, b := [16]byte{1}, [16]byte{2}
	sealed, err := k.sealIdPSecret("s3cret", a)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := k.openIdPSecret(sealed, a); err != nil || got != "s3cret" {
		t.Fatalf("open: %q %v", got, err)
	}
	if _, err := k.openIdPSecret(sealed, b); err == nil {
		t.Fatal("a secret sealed for one tenant opened for another")
	}
}
