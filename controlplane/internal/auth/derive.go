package auth

import (
	"crypto/hmac"
	"crypto/sha256"
)

// Derive returns a 32-byte key for one purpose (e.g. "gantry/cursor"), derived from the
// master key with HMAC-SHA256, so other features get keys of their own without the
// master key's bytes ever leaving this package.
func (k MasterKey) Derive(purpose string) []byte {
	m := hmac.New(sha256.New, k.key[:])
	m.Write([]byte(purpose))
	return m.Sum(nil)
}
