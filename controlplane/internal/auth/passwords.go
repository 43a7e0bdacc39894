package auth

import (
	"sync"
	"unicode/utf8"

	"github.com/alexedwards/argon2id"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Password policy: length in characters (runes), as in the contract.
const (
	MinPasswordLength = 12
	MaxPasswordLength = 256
)

// PasswordParams are the argon2id parameters of new hashes. They follow the OWASP
// Password Storage Cheat Sheet's first argon2id configuration (19 MiB, 2 passes, 1
// lane): strong enough that an offline guess costs 19 MiB of memory, light enough that
// a burst of logins cannot exhaust the server's memory (50 concurrent logins ≈ 1 GiB).
// The parameters are encoded in each hash, so raising them later affects new hashes
// only and old ones keep verifying.
var PasswordParams = &argon2id.Params{
	Memory:      19 * 1024, // KiB
	Iterations:  2,
	Parallelism: 1,
	SaltLength:  16,
	KeyLength:   32,
}

// ValidatePassword applies the password policy; the error is a validation_error on
// the field "password".
func ValidatePassword(password string) error {
	n := utf8.RuneCountInString(password)
	if n < MinPasswordLength || n > MaxPasswordLength {
		return apierr.Validation("password", "password must be %d to %d characters", MinPasswordLength, MaxPasswordLength)
	}
	return nil
}

// HashPassword checks the policy and returns the argon2id hash (PHC string) of password.
func HashPassword(password string) (string, error) {
	if err := ValidatePassword(password); err != nil {
		return "", err
	}
	return argon2id.CreateHash(password, PasswordParams)
}

var dummy struct {
	once sync.Once
	hash string
}

// dummyHash is a hash of a random-looking constant with the current parameters. Logins
// for users that do not exist (or have no password) compare against it, so answering
// them costs the same argon2id work as a real check: no username oracle via timing.
func dummyHash() string {
	dummy.once.Do(func() {
		h, err := argon2id.CreateHash("gantry-dummy-password-for-timing", PasswordParams)
		if err != nil {
			panic("auth: dummy hash: " + err.Error())
		}
		dummy.hash = h
	})
	return dummy.hash
}

// CheckPassword reports whether password matches hash. A nil hash (no such user, or a
// user without a password) runs the same argon2id work against a dummy hash and
// reports false. The comparison itself is constant-time (argon2id.ComparePasswordAndHash).
func CheckPassword(password string, hash *string) bool {
	if hash == nil || *hash == "" {
		_, _ = argon2id.ComparePasswordAndHash(password, dummyHash())
		return false
	}
	ok, err := argon2id.ComparePasswordAndHash(password, *hash)
	return err == nil && ok
}
