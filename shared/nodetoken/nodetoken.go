// Package nodetoken owns the format of the opaque node bearer token that an enrolled
// agent presents to the fabric, the node-facing REST operations and the log gateway:
//
//	gnt_<node id: 32 lowercase hex digits, no dashes>_<secret: 43 chars base64url (no padding) of 32 random bytes>
//
// The node id is readable without a lookup, so a verifier fetches exactly one stored
// hash; the secret never is. Only Hash(token) (SHA-256 of the whole token) is stored.
// Verify compares in constant time. The package never logs or stores a token.
package nodetoken

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/google/uuid"
)

const (
	// Prefix starts every node token.
	Prefix = "gnt_"
	// SecretBytes is the entropy of a token.
	SecretBytes = 32
	idHexLen    = 32
	secretLen   = 43 // base64url, no padding, of 32 bytes
	// Len is the exact length of every well-formed token.
	Len = len(Prefix) + idHexLen + 1 + secretLen
)

// ErrMalformed is returned by Parse for anything that is not a well-formed token.
var ErrMalformed = errors.New("nodetoken: malformed token")

// New mints a token for nodeID with 32 bytes from rand (crypto/rand.Reader in production).
func New(nodeID uuid.UUID, rand io.Reader) (string, error) {
	if nodeID == uuid.Nil {
		return "", errors.New("nodetoken: nil node id")
	}
	var secret [SecretBytes]byte
	if _, err := io.ReadFull(rand, secret[:]); err != nil {
		return "", fmt.Errorf("nodetoken: random: %w", err)
	}
	buf := make([]byte, 0, Len)
	buf = append(buf, Prefix...)
	buf = hex.AppendEncode(buf, nodeID[:])
	buf = append(buf, '_')
	buf = base64.RawURLEncoding.AppendEncode(buf, secret[:])
	return string(buf), nil
}

// Parse checks the token's shape and returns the node id it names. It says nothing
// about whether the token is valid: only Verify against the stored hash does.
func Parse(token string) (uuid.UUID, error) {
	if len(token) != Len || token[:len(Prefix)] != Prefix || token[len(Prefix)+idHexLen] != '_' {
		return uuid.Nil, ErrMalformed
	}
	idHex := token[len(Prefix) : len(Prefix)+idHexLen]
	var id uuid.UUID
	for i := 0; i < idHexLen; i++ { // lowercase only: one spelling per token
		c := idHex[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return uuid.Nil, ErrMalformed
		}
	}
	if _, err := hex.Decode(id[:], []byte(idHex)); err != nil || id == uuid.Nil {
		return uuid.Nil, ErrMalformed
	}
	secret := token[len(Prefix)+idHexLen+1:]
	raw, err := base64.RawURLEncoding.Strict().DecodeString(secret)
	if err != nil || len(raw) != SecretBytes {
		return uuid.Nil, ErrMalformed
	}
	return id, nil
}

// Hash is what is stored for token: SHA-256 of the whole token. The secret carries 256
// bits of entropy, so a fast hash is sufficient (no password-style stretching).
func Hash(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

// Verify reports whether token is well formed and hashes to storedHash, comparing in
// constant time.
func Verify(token string, storedHash []byte) bool {
	h := sha256.Sum256([]byte(token))
	ok := subtle.ConstantTimeCompare(h[:], storedHash) == 1
	_, err := Parse(token)
	return ok && err == nil
}
