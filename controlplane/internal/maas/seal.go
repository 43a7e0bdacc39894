package maas

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/google/uuid"
)

// sealer encrypts secrets (API keys, enrollment tokens) with AES-256-GCM under a key
// derived from the master key; the additional data binds a sealed value to its row.
type sealer struct{ key []byte }

func (s sealer) aead() (cipher.AEAD, error) {
	if len(s.key) != 32 {
		return nil, errors.New("maas: seal key must be 32 bytes")
	}
	b, err := aes.NewCipher(s.key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

func (s sealer) seal(plain []byte, what string, id uuid.UUID) ([]byte, error) {
	a, err := s.aead()
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, a.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return a.Seal(nonce, nonce, plain, []byte("gantry/maas/"+what+"/"+id.String())), nil
}

func (s sealer) open(sealed []byte, what string, id uuid.UUID) ([]byte, error) {
	a, err := s.aead()
	if err != nil {
		return nil, err
	}
	if len(sealed) < a.NonceSize() {
		return nil, fmt.Errorf("maas: sealed %s too short", what)
	}
	plain, err := a.Open(nil, sealed[:a.NonceSize()], sealed[a.NonceSize():], []byte("gantry/maas/"+what+"/"+id.String()))
	if err != nil {
		return nil, fmt.Errorf("maas: open sealed %s: %w", what, err)
	}
	return plain, nil
}
