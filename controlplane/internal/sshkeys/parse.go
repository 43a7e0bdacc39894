package sshkeys

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"errors"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

// MinRSABits is the smallest RSA modulus accepted.
const MinRSABits = 2048

// allowedTypes are the key algorithms accepted.
var allowedTypes = map[string]bool{
	ssh.KeyAlgoED25519:    true,
	ssh.KeyAlgoECDSA256:   true,
	ssh.KeyAlgoECDSA384:   true,
	ssh.KeyAlgoECDSA521:   true,
	ssh.KeyAlgoRSA:        true,
	ssh.KeyAlgoSKED25519:  true,
	ssh.KeyAlgoSKECDSA256: true,
}

// retiredTypes are key types the SSH library no longer parses; they are refused by name.
var retiredTypes = map[string]bool{"ssh-dss": true}

// Parsed is a validated public key.
type Parsed struct {
	Type        string // e.g. ssh-ed25519
	PublicKey   string // normalised: "<type> <base64>"
	Comment     string
	Fingerprint string // SHA256:...
	Bits        int
}

func refuse(reason, format string, args ...any) *apierr.Error {
	return apierr.Validation("public_key", format, args...).With("reason", reason)
}

// Parse validates one authorized_keys line.
func Parse(line string) (Parsed, error) {
	in := []byte(strings.TrimSpace(line))
	if len(in) == 0 {
		return Parsed{}, refuse("invalid_key", "public_key is not an OpenSSH public key")
	}
	key, comment, options, rest, err := ssh.ParseAuthorizedKey(in)
	if err != nil {
		// x/crypto/ssh no longer parses some retired types at all (ssh-dss): a user who
		// pastes one is told its type is refused, not that the line is malformed.
		if f := strings.Fields(string(in)); len(f) > 0 && retiredTypes[f[0]] {
			return Parsed{}, refuse("unsupported_key_type", "key type %s is not accepted", f[0]).With("key_type", f[0])
		}
		return Parsed{}, refuse("invalid_key", "public_key is not an OpenSSH public key")
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		return Parsed{}, refuse("invalid_key", "public_key must hold exactly one key")
	}
	if len(options) > 0 {
		return Parsed{}, refuse("options_not_allowed", "authorized_keys options are not accepted")
	}
	typ := key.Type()
	if !allowedTypes[typ] {
		return Parsed{}, refuse("unsupported_key_type", "key type %s is not accepted", typ).With("key_type", typ)
	}
	bits, err := bitsOf(key)
	if err != nil {
		return Parsed{}, refuse("invalid_key", "public_key is not an OpenSSH public key")
	}
	if typ == ssh.KeyAlgoRSA && bits < MinRSABits {
		return Parsed{}, refuse("weak_key", "RSA keys need at least %d bits, this one has %d", MinRSABits, bits).
			With("bits", bits).With("min_bits", MinRSABits)
	}
	return Parsed{
		Type:        typ,
		PublicKey:   strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key))),
		Comment:     comment,
		Fingerprint: ssh.FingerprintSHA256(key),
		Bits:        bits,
	}, nil
}

// bitsOf is the key size: the RSA modulus, the ECDSA curve, 256 for Ed25519.
func bitsOf(key ssh.PublicKey) (int, error) {
	ck, ok := key.(ssh.CryptoPublicKey)
	if !ok {
		return 0, errUnsized
	}
	switch k := ck.CryptoPublicKey().(type) {
	case *rsa.PublicKey:
		return k.N.BitLen(), nil
	case *ecdsa.PublicKey:
		return k.Curve.Params().BitSize, nil
	case ed25519.PublicKey:
		return 256, nil
	}
	return 0, errUnsized
}

var errUnsized = errors.New("key size unknown")
