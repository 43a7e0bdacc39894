package auth

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
)

// Config is the auth configuration, read from the environment with caarlos0/env.
type Config struct {
	// Issuer is the iss of every access token, and the only one accepted.
	Issuer string `env:"GANTRY_JWT_ISSUER" envDefault:"gantry"`
	// Audience is the aud of every access token, and the only one accepted.
	Audience string `env:"GANTRY_JWT_AUDIENCE" envDefault:"gantry-api"`
	// AccessTokenTTL is the lifetime of an access token.
	AccessTokenTTL time.Duration `env:"GANTRY_ACCESS_TOKEN_TTL" envDefault:"15m"`
	// RefreshTokenTTL is the lifetime of a refresh token (each rotation starts a new one).
	RefreshTokenTTL time.Duration `env:"GANTRY_REFRESH_TOKEN_TTL" envDefault:"720h"`
	// SigningKeyRotation is the age at which RotateIfDue replaces the active signing key.
	SigningKeyRotation time.Duration `env:"GANTRY_SIGNING_KEY_ROTATION" envDefault:"720h"`
	// MasterKey encrypts signing keys at rest: base64 of 32 bytes.
	MasterKey MasterKey `env:"GANTRY_MASTER_KEY"`
	// InternalJWKSRefreshToken enables POST /internal/auth/jwks/refresh when non-empty;
	// it is the bearer that call must present.
	InternalJWKSRefreshToken string `env:"INTERNAL_JWKS_REFRESH_TOKEN"`
	// PersonalSignup allows personal sign-up (POST /api/v1/auth/signup).
	PersonalSignup bool `env:"GANTRY_PERSONAL_SIGNUP" envDefault:"true"`
	// Per-username sign-in backoff (throttle.go): after LoginFreeFailures failures each
	// further one locks the username for LoginBackoffBase doubling per failure, at most
	// LoginBackoffMax; failures older than LoginFailureMemory are forgotten.
	LoginFreeFailures  int           `env:"GANTRY_LOGIN_FREE_FAILURES" envDefault:"5"`
	LoginBackoffBase   time.Duration `env:"GANTRY_LOGIN_BACKOFF_BASE" envDefault:"1s"`
	LoginBackoffMax    time.Duration `env:"GANTRY_LOGIN_BACKOFF_MAX" envDefault:"15m"`
	LoginFailureMemory time.Duration `env:"GANTRY_LOGIN_FAILURE_MEMORY" envDefault:"1h"`
	// StepUpWindow is how long after its TOTP code a step-up token satisfies
	// RequireStepUp (stepup.go).
	StepUpWindow time.Duration `env:"GANTRY_STEP_UP_WINDOW" envDefault:"5m"`
	// MachineTokenTTL is the lifetime of access tokens from the client-credentials grant
	// (machine.go): short, because a revoked credential's issued tokens live until then.
	MachineTokenTTL time.Duration `env:"GANTRY_MACHINE_TOKEN_TTL" envDefault:"15m"`
}

// Leeway is the clock skew tolerated on exp and nbf of an access token.
const Leeway = 30 * time.Second

// DefaultConfig is the configuration with every default and no master key.
func DefaultConfig() Config {
	return Config{
		Issuer:             "gantry",
		Audience:           "gantry-api",
		AccessTokenTTL:     15 * time.Minute,
		RefreshTokenTTL:    30 * 24 * time.Hour,
		SigningKeyRotation: 30 * 24 * time.Hour,
		PersonalSignup:     true,
		LoginFreeFailures:  5,
		LoginBackoffBase:   time.Second,
		LoginBackoffMax:    15 * time.Minute,
		LoginFailureMemory: time.Hour,
		StepUpWindow:       5 * time.Minute,
		MachineTokenTTL:    15 * time.Minute,
	}
}

// LoadConfig reads Config from the environment and validates it (see Validate).
func LoadConfig(dev bool) (Config, error) {
	cfg, err := env.ParseAs[Config]()
	if err != nil {
		return Config{}, fmt.Errorf("auth config: %w", err)
	}
	if err := cfg.Validate(dev); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// Validate checks the configuration. Outside dev a master key is required; in dev a
// missing one is replaced by DevMasterKey so `make dev` needs no setup.
func (c *Config) Validate(dev bool) error {
	if !c.MasterKey.set {
		if !dev {
			return errors.New("auth config: GANTRY_MASTER_KEY is required (base64 of 32 random bytes, e.g. `openssl rand -base64 32`)")
		}
		c.MasterKey = DevMasterKey()
	}
	switch {
	case c.Issuer == "":
		return errors.New("auth config: GANTRY_JWT_ISSUER is empty")
	case c.Audience == "":
		return errors.New("auth config: GANTRY_JWT_AUDIENCE is empty")
	case c.AccessTokenTTL < time.Minute:
		return errors.New("auth config: GANTRY_ACCESS_TOKEN_TTL must be at least 1m")
	case c.RefreshTokenTTL < c.AccessTokenTTL:
		return errors.New("auth config: GANTRY_REFRESH_TOKEN_TTL must be at least the access-token TTL")
	case c.SigningKeyRotation < time.Hour:
		return errors.New("auth config: GANTRY_SIGNING_KEY_ROTATION must be at least 1h")
	case c.LoginFreeFailures < 1:
		return errors.New("auth config: GANTRY_LOGIN_FREE_FAILURES must be at least 1")
	case c.LoginBackoffBase <= 0 || c.LoginBackoffMax < c.LoginBackoffBase:
		return errors.New("auth config: GANTRY_LOGIN_BACKOFF_BASE must be positive and at most GANTRY_LOGIN_BACKOFF_MAX")
	case c.LoginFailureMemory < c.LoginBackoffMax:
		return errors.New("auth config: GANTRY_LOGIN_FAILURE_MEMORY must be at least GANTRY_LOGIN_BACKOFF_MAX (else a lock would be forgotten before it ends)")
	case c.StepUpWindow != 0 && (c.StepUpWindow < 30*time.Second || c.StepUpWindow > c.AccessTokenTTL):
		return errors.New("auth config: GANTRY_STEP_UP_WINDOW must be between 30s and GANTRY_ACCESS_TOKEN_TTL")
	case c.MachineTokenTTL != 0 && (c.MachineTokenTTL < time.Minute || c.MachineTokenTTL > time.Hour):
		return errors.New("auth config: GANTRY_MACHINE_TOKEN_TTL must be between 1m and 1h")
	}
	return nil
}

// MasterKey is the 32-byte AES-256 key that encrypts signing keys at rest. It never
// prints its bytes.
type MasterKey struct {
	key [32]byte
	set bool
}

// ParseMasterKey decodes base64 (standard or URL alphabet, padded or not) of exactly
// 32 bytes.
func ParseMasterKey(s string) (MasterKey, error) {
	s = strings.TrimSpace(s)
	var raw []byte
	var err error
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if raw, err = enc.DecodeString(s); err == nil {
			break
		}
	}
	if err != nil {
		return MasterKey{}, errors.New("GANTRY_MASTER_KEY is not valid base64")
	}
	if len(raw) != 32 {
		return MasterKey{}, fmt.Errorf("GANTRY_MASTER_KEY must decode to 32 bytes, got %d", len(raw))
	}
	var k MasterKey
	copy(k.key[:], raw)
	k.set = true
	return k, nil
}

// DevMasterKey is the fixed key `make dev` uses when GANTRY_MASTER_KEY is unset. It is
// public, so it protects nothing; Validate refuses to fall back to it outside dev.
func DevMasterKey() MasterKey {
	return MasterKey{key: sha256.Sum256([]byte("gantry development master key: not a secret")), set: true}
}

// UnmarshalText lets caarlos0/env parse GANTRY_MASTER_KEY; an empty value leaves the
// key unset (Validate decides whether that is allowed).
func (k *MasterKey) UnmarshalText(text []byte) error {
	if len(strings.TrimSpace(string(text))) == 0 {
		*k = MasterKey{}
		return nil
	}
	parsed, err := ParseMasterKey(string(text))
	if err != nil {
		return err
	}
	*k = parsed
	return nil
}

// IsSet reports whether the key holds a value.
func (k MasterKey) IsSet() bool { return k.set }

func (k MasterKey) String() string   { return "MasterKey(redacted)" }
func (k MasterKey) GoString() string { return "MasterKey(redacted)" }

// stepUpWindow is StepUpWindow, 5 minutes when unset.
func (c Config) stepUpWindow() time.Duration {
	if c.StepUpWindow <= 0 {
		return 5 * time.Minute
	}
	return c.StepUpWindow
}

// machineTokenTTL is MachineTokenTTL, 15 minutes when unset.
func (c Config) machineTokenTTL() time.Duration {
	if c.MachineTokenTTL <= 0 {
		return 15 * time.Minute
	}
	return c.MachineTokenTTL
}
