package auth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-gpu/gantry/controlplane/internal/auth/authdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Per-account sign-in backoff. The per-IP limit (ratelimit, group auth) does not stop a
// password guesser who spreads over many addresses; this limit follows the account
// instead. After LoginFreeFailures failed sign-ins, each further failure locks the
// username for LoginBackoffBase·2^(n−free) (n: failures so far), never longer than
// LoginBackoffMax; while locked every sign-in is refused 429 rate_limit_exceeded with
// Retry-After, without checking the password. A success deletes the record; a record
// with no failure for LoginFailureMemory is forgotten.
//
// Why these rules:
//   - Counted per normalized username whether the account exists or not, and answered
//     the same way, so the limit does not tell which usernames exist.
//   - An attempt is charged as a failure BEFORE its password is checked (and cleared if
//     it succeeds), so a burst of concurrent guesses cannot all slip through before the
//     first failure is recorded; the charge is a short transaction that holds the row
//     lock only while deciding, never during the password hash.
//   - Refused attempts are not failures: a flood cannot extend a lock, so an attacker
//     can keep one account locked for at most LoginBackoffMax past their last real guess,
//     and gets at most one guess per LoginBackoffMax once at the cap (the unavoidable
//     price of any per-account limit is that a persistent attacker can keep the victim
//     waiting; the cap bounds each wait).
//   - PostgreSQL, not Redis: every replica must share the counters, sign-in already
//     needs PostgreSQL (the user row), so the limit adds no dependency and cannot fail
//     open when Redis does; it costs two short statements per sign-in.

// LoginPolicy is the backoff; Config carries it from the environment.
type LoginPolicy struct {
	FreeFailures int
	Base         time.Duration
	Max          time.Duration
	Memory       time.Duration
}

// loginPolicy is the configured policy with defaults for unset fields.
func (c Config) loginPolicy() LoginPolicy {
	p := LoginPolicy{FreeFailures: c.LoginFreeFailures, Base: c.LoginBackoffBase, Max: c.LoginBackoffMax, Memory: c.LoginFailureMemory}
	if p.FreeFailures <= 0 {
		p.FreeFailures = 5
	}
	if p.Base <= 0 {
		p.Base = time.Second
	}
	if p.Max <= 0 {
		p.Max = 15 * time.Minute
	}
	if p.Memory <= 0 {
		p.Memory = time.Hour
	}
	return p
}

// Lock is how long the n-th failure locks the account (0 below the free failures).
func (p LoginPolicy) Lock(n int) time.Duration {
	if n < p.FreeFailures {
		return 0
	}
	d := p.Base
	for i := p.FreeFailures; i < n && d < p.Max; i++ {
		d *= 2
	}
	return min(d, p.Max)
}

// loginMetrics are the sign-in limit's counters.
type loginMetrics struct {
	failures prometheus.Counter
	refused  prometheus.Counter
}

func newLoginMetrics() loginMetrics {
	return loginMetrics{
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "api_login_failures_total",
			Help: "Failed sign-ins (wrong or unknown username or password, inactive account).",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "api_login_backoff_refused_total",
			Help: "Sign-ins refused with 429 because the username is in failure backoff.",
		}),
	}
}

// Collectors are the sign-in limit's and the platform role operations' metrics, for the
// app's registry.
func (s *Service) Collectors() []prometheus.Collector {
	return append([]prometheus.Collector{s.login.failures, s.login.refused}, s.roles.collectors()...)
}

// usernameKey is what the throttle stores of a username: SHA-256 of its normalized form.
func usernameKey(username string) []byte {
	sum := sha256.Sum256([]byte(strings.ToLower(strings.TrimSpace(username))))
	return sum[:]
}

// errLoginBackoff is the answer while a username is locked.
func errLoginBackoff(wait time.Duration) *apierr.Error {
	return apierr.New(apierr.RateLimitExceeded, "too many failed sign-ins for this username; retry later").
		With("reason", "login_backoff").WithRetryAfter(wait)
}

// chargeLoginAttempt refuses the attempt while key is locked, else records it as a
// failure (cleared by clearLoginThrottle when it succeeds).
func (s *Service) chargeLoginAttempt(ctx context.Context, key []byte) error {
	return s.chargeAttempt(ctx, key, errLoginBackoff)
}

// chargeAttempt is chargeLoginAttempt with the refusal refuse builds; the TOTP checks
// of an authenticated user (mfa.go) use it with their own key and refusal.
func (s *Service) chargeAttempt(ctx context.Context, key []byte, refuse func(time.Duration) *apierr.Error) error {
	pol := s.cfg.loginPolicy()
	now := s.clock.Now()
	var refusal *apierr.Error
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := authdb.New(tx)
		row, err := q.LockLoginThrottle(ctx, authdb.LockLoginThrottleParams{UsernameHash: key, Now: now})
		if err != nil {
			return err
		}
		if row.LockedUntil != nil && now.Before(*row.LockedUntil) {
			refusal = refuse(row.LockedUntil.Sub(now))
			return nil
		}
		failures := int(row.Failures)
		if now.Sub(row.LastFailureAt) >= pol.Memory {
			failures = 0 // long quiet: start over
		}
		failures++
		var lockedUntil *time.Time
		if d := pol.Lock(failures); d > 0 {
			t := now.Add(d)
			lockedUntil = &t
		}
		if err := q.ChargeLoginFailure(ctx, authdb.ChargeLoginFailureParams{
			UsernameHash: key, Failures: int32(failures), Now: now, LockedUntil: lockedUntil,
		}); err != nil {
			return err
		}
		// Forget a few stale records of other usernames, so unknown names typed once do
		// not accumulate.
		_, err = q.PruneLoginThrottle(ctx, authdb.PruneLoginThrottleParams{ForgottenBefore: now.Add(-pol.Memory), Now: now})
		return err
	})
	if err != nil {
		return apierr.Internal(fmt.Errorf("login throttle: %w", err))
	}
	if refusal != nil {
		s.login.refused.Inc()
		return refusal
	}
	return nil
}

// clearLoginThrottle forgets key's failures (a successful sign-in, in its transaction).
func clearLoginThrottle(ctx context.Context, tx pgx.Tx, key []byte) error {
	if err := authdb.New(tx).ClearLoginThrottle(ctx, key); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("clear login throttle: %w", err)
	}
	return nil
}
