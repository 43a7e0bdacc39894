package auth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/auth/authdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Machine access tokens (issue 19 item 5). The client-credentials grant
// (controlplane/internal/machineid) signs them here, with the same key, issuer,
// audience and scope as a person's, so every replica verifies them from memory like any
// access token. They differ in three ways: a "mach" claim names the credential and the
// projects and roles it may act in (the only rights it has: no tenant role, no platform
// role); they never carry amr/auth_time, so they can never satisfy step-up; and they
// live MachineTokenTTL. A revoked credential gets no new token at once; a token already
// issued stays valid until its exp, which is why the TTL is short.

// MachineGrant is what a machine token says about its holder.
type MachineGrant struct {
	// UserID is the identity's own users row; Username its name there.
	UserID   uuid.UUID
	Username string
	TenantID uuid.UUID
	Machine  principal.Machine
}

// machineClaims is the "mach" claim.
type machineClaims struct {
	Kind             string            `json:"k"`
	ServiceAccountID string            `json:"sa,omitempty"`
	CredentialID     string            `json:"cid"`
	Projects         map[string]string `json:"prj"`
}

// machine validates the claim and returns it as a principal.Machine.
func (c *machineClaims) machine() (*principal.Machine, error) {
	m := &principal.Machine{Kind: c.Kind, Projects: make(map[uuid.UUID]string, len(c.Projects))}
	var err error
	switch c.Kind {
	case principal.MachineServiceAccount:
		if m.ServiceAccountID, err = uuid.Parse(c.ServiceAccountID); err != nil {
			return nil, fmt.Errorf("mach.sa: %w", err)
		}
	case principal.MachineProjectCredential:
		if c.ServiceAccountID != "" || len(c.Projects) != 1 {
			return nil, errors.New("mach: a project credential acts in exactly one project")
		}
	default:
		return nil, fmt.Errorf("mach.k %q", c.Kind)
	}
	if m.CredentialID, err = uuid.Parse(c.CredentialID); err != nil {
		return nil, fmt.Errorf("mach.cid: %w", err)
	}
	for id, role := range c.Projects {
		pid, err := uuid.Parse(id)
		if err != nil {
			return nil, fmt.Errorf("mach.prj: %w", err)
		}
		if role != projectctx.RoleAdmin && role != projectctx.RoleMember && role != projectctx.RoleViewer {
			return nil, fmt.Errorf("mach.prj role %q", role)
		}
		m.Projects[pid] = role
	}
	return m, nil
}

// MachineTokenTTL is the lifetime of machine access tokens.
func (s *Service) MachineTokenTTL() time.Duration { return s.cfg.machineTokenTTL() }

// SignMachineAccess signs a machine access token for g.
func (s *Service) SignMachineAccess(ctx context.Context, g MachineGrant) (string, time.Time, error) {
	mc := &machineClaims{Kind: g.Machine.Kind, CredentialID: g.Machine.CredentialID.String(), Projects: make(map[string]string, len(g.Machine.Projects))}
	if g.Machine.ServiceAccountID != uuid.Nil {
		mc.ServiceAccountID = g.Machine.ServiceAccountID.String()
	}
	for id, role := range g.Machine.Projects {
		mc.Projects[id.String()] = role
	}
	return s.signToken(ctx, accessClaims{
		Subject: g.UserID.String(), Username: g.Username, TenantID: g.TenantID.String(),
		PlatformRoles: []string{}, RoleSource: principal.RoleSourceBindings,
		Machine: mc,
	}, s.cfg.machineTokenTTL())
}

// clientKey is what the failure throttle stores of a client id; the prefix keeps it
// apart from usernames and MFA keys in the same table.
func clientKey(clientID string) []byte {
	sum := sha256.Sum256([]byte("client-credentials:" + clientID))
	return sum[:]
}

// ErrClientLocked is the refusal while a client id is locked; RetryAfter says for how long.
type ErrClientLocked struct{ RetryAfter time.Duration }

func (e *ErrClientLocked) Error() string { return "client id locked after failed secrets" }

// Client ids get the sign-in backoff (throttle.go) for failed secrets, with one
// difference that keeps a good client's grant at a single query: the record is read
// before the secret is compared and a failure is charged after it, instead of charging
// every attempt up front. A burst of concurrent guesses can therefore get a few more
// compares than the limit before the first failure lands; against a 256-bit secret
// that is worth nothing, while charging up front would put every grant of a client id
// through one locked row.

// ClientThrottle reads clientID's failure record without changing it: how long the
// client id is still locked (0 when not) and whether there are failures to forget on
// success.
func (s *Service) ClientThrottle(ctx context.Context, clientID string) (time.Duration, bool, error) {
	lockedUntil, err := authdb.New(db.Querier(ctx, s.pool)).GetLoginThrottleLock(ctx, clientKey(clientID))
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("client throttle: %w", err)
	}
	if now := s.clock.Now(); lockedUntil != nil && now.Before(*lockedUntil) {
		return lockedUntil.Sub(now), true, nil
	}
	return 0, true, nil
}

// ChargeClientFailure records a failed secret of clientID; *ErrClientLocked when the
// client id was locked meanwhile (the failure is then not charged, as in throttle.go).
func (s *Service) ChargeClientFailure(ctx context.Context, clientID string) error {
	var wait time.Duration
	err := s.chargeAttempt(ctx, clientKey(clientID), func(d time.Duration) *apierr.Error {
		wait = d
		return apierr.New(apierr.RateLimitExceeded, "client locked")
	})
	if wait > 0 {
		return &ErrClientLocked{RetryAfter: wait}
	}
	return err
}

// ForgetClientFailures clears clientID's failures after a successful grant.
func (s *Service) ForgetClientFailures(ctx context.Context, clientID string) error {
	if err := authdb.New(db.Querier(ctx, s.pool)).ClearLoginThrottle(ctx, clientKey(clientID)); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("clear client throttle: %w", err)
	}
	return nil
}
