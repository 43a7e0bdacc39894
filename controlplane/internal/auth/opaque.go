package auth

import (
	"encoding/base64"
	"strings"

	"github.com/gantry-gpu/gantry/shared/nodetoken"
)

// Gantry mints opaque credentials besides access tokens. Presented as a bearer to the
// REST API they are not forgeries but the wrong kind of token, so seed §5 rule 2 answers
// token_scope_invalid, telling a client that sends its refresh token by mistake what is
// wrong. Recognition is by shape only (no lookup), so the answer reveals nothing about
// whether the token exists; everything else that is not a compact JWS stays token_invalid.
const (
	// opaqueSecretLen is the text length of 32 random bytes in unpadded base64url: the
	// secret of refresh, enrollment and terminal tokens.
	opaqueSecretLen = 43
	// enrollmentTokenPrefix mirrors nodes.enrollmentPrefix (one-time node enrollment
	// tokens, controlplane/internal/nodes/tokens.go).
	enrollmentTokenPrefix = "gne_"
	// ClientSecretPrefix starts every machine client secret (controlplane/internal/machineid):
	// sent as a bearer instead of exchanged at POST /api/v1/auth/token, it is
	// token_scope_invalid.
	ClientSecretPrefix = "gcs_"
)

// opaqueTokenKind names the kind of Gantry opaque token tok is shaped like ("refresh",
// "node", "enrollment", "terminal"), or "" when it is none of them.
func opaqueTokenKind(tok string) string {
	switch {
	case strings.HasPrefix(tok, RefreshTokenPrefix) && isSecret(tok[len(RefreshTokenPrefix):]):
		return "refresh"
	case strings.HasPrefix(tok, nodetoken.Prefix):
		if _, err := nodetoken.Parse(tok); err == nil {
			return "node"
		}
	case strings.HasPrefix(tok, enrollmentTokenPrefix) && isSecret(tok[len(enrollmentTokenPrefix):]):
		return "enrollment"
	case strings.HasPrefix(tok, ClientSecretPrefix) && isSecret(tok[len(ClientSecretPrefix):]):
		return "client secret"
	case isSecret(tok):
		// Terminal tokens (controlplane/internal/terminal/token.go) carry no prefix: they
		// double as a WebSocket subprotocol, so they are the bare 43-character secret.
		return "terminal"
	}
	return ""
}

// IsClientSecret reports whether s is shaped like a machine client secret: the prefix and
// unpadded base64url of 32 bytes.
func IsClientSecret(s string) bool {
	rest, ok := strings.CutPrefix(s, ClientSecretPrefix)
	return ok && isSecret(rest)
}

// isSecret reports whether s is unpadded base64url of 32 bytes.
func isSecret(s string) bool {
	if len(s) != opaqueSecretLen {
		return false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	return err == nil && len(b) == 32
}
