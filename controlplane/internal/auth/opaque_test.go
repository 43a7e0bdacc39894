package auth

import (
	"crypto/rand"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/nodetoken"
)

// TestOpaqueTokensAreOutOfScope: Gantry's own opaque tokens sent as the bearer are
// token_scope_invalid (seed §5 rule 2, docs/api.md); near misses stay token_invalid.
func TestOpaqueTokensAreOutOfScope(t *testing.T) {
	f := newFixture(t)
	secret := func() string {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	node, err := nodetoken.New(uuid.New(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, token string
		want        apierr.Code
	}{
		{"refresh token", RefreshTokenPrefix + secret(), apierr.TokenScopeInvalid},
		{"node token", node, apierr.TokenScopeInvalid},
		{"enrollment token", "gne_" + secret(), apierr.TokenScopeInvalid},
		{"terminal token", secret(), apierr.TokenScopeInvalid},
		{"client secret", ClientSecretPrefix + secret(), apierr.TokenScopeInvalid},
		{"refresh prefix, short secret", RefreshTokenPrefix + secret()[:40], apierr.TokenInvalid},
		{"node prefix, malformed", nodetoken.Prefix + strings.Repeat("z", 76), apierr.TokenInvalid},
		{"43 characters outside base64url", strings.Repeat("!", 43), apierr.TokenInvalid},
		{"42 characters", secret()[:42], apierr.TokenInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wantCode(t, f.authenticate(tc.token), tc.want)
		})
	}
}
