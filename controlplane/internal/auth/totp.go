package auth

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base32"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/pquerna/otp"
	"github.com/pquerna/otp/totp"
)

// TOTP as authenticator apps implement it (RFC 6238 over RFC 4226): HMAC-SHA1, 6 digits,
// 30-second steps. The codes come from github.com/pquerna/otp; this file adds what a
// server needs around them: which time-step a code belongs to (the replay guard stores
// the last accepted step per user), a constant-time comparison, and the sealing of the
// secret under the master key.
const (
	totpPeriod = 30
	totpDigits = otp.DigitsSix
	// totpSkew: a code of the previous or the next step is accepted too, for clock drift
	// and the seconds a person needs to type it.
	totpSkew = 1
	// totpSecretBytes: 160 bits, the HMAC-SHA1 block the RFC recommends.
	totpSecretBytes = 20
	totpIssuer      = "Gantry"
)

var b32 = base32.StdEncoding.WithPadding(base32.NoPadding)

// totpStep is the RFC 6238 time-step of t.
func totpStep(t time.Time) int64 { return t.Unix() / totpPeriod }

// totpCodeAt is the code of secret for time-step step with the given digits and hash
// (the RFC's test vectors use 8 digits and SHA-256/512 as well).
func totpCodeAt(secret []byte, step int64, digits otp.Digits, alg otp.Algorithm) (string, error) {
	return totp.GenerateCodeCustom(b32.EncodeToString(secret), time.Unix(step*totpPeriod, 0).UTC(),
		totp.ValidateOpts{Period: totpPeriod, Digits: digits, Algorithm: alg})
}

// matchTOTP reports which time-step within ±totpSkew of now code belongs to. Every
// candidate is computed and compared in constant time, so the answer's timing does not
// tell which step (if any) matched.
func matchTOTP(secret []byte, code string, now time.Time) (step int64, ok bool) {
	if len(code) != int(totpDigits) {
		return 0, false
	}
	cur := totpStep(now)
	for s := cur - totpSkew; s <= cur+totpSkew; s++ {
		want, err := totpCodeAt(secret, s, totpDigits, otp.AlgorithmSHA1)
		if err != nil {
			continue
		}
		if subtle.ConstantTimeCompare([]byte(want), []byte(code)) == 1 && !ok {
			step, ok = s, true
		}
	}
	return step, ok
}

// newTOTPSecret returns a fresh random secret.
func newTOTPSecret() ([]byte, error) {
	b := make([]byte, totpSecretBytes)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("totp secret: %w", err)
	}
	return b, nil
}

// otpauthURI is the Key URI authenticator apps import (QR code), for account.
func otpauthURI(account string, secret []byte) (string, error) {
	key, err := totp.Generate(totp.GenerateOpts{
		Issuer: totpIssuer, AccountName: account, Period: totpPeriod, Digits: totpDigits,
		Algorithm: otp.AlgorithmSHA1, Secret: secret,
	})
	if err != nil {
		return "", fmt.Errorf("otpauth uri: %w", err)
	}
	return key.URL(), nil
}

// sealTOTPSecret encrypts a user's TOTP secret under the master key; the additional
// data binds it to the user, so a sealed secret copied onto another user's row does not
// open.
func (m MasterKey) sealTOTPSecret(secret []byte, userID uuid.UUID) ([]byte, error) {
	return m.sealAD(secret, totpAAD(userID))
}

// openTOTPSecret decrypts what sealTOTPSecret produced for userID.
func (m MasterKey) openTOTPSecret(sealed []byte, userID uuid.UUID) ([]byte, error) {
	return m.openAD(sealed, totpAAD(userID), "TOTP secret")
}

func totpAAD(userID uuid.UUID) []byte { return []byte("gantry/auth/totp/" + userID.String()) }
