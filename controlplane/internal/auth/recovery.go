package auth

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/auth/authdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Recovery codes and support-assisted recovery.
//
// A verify hands out RecoveryCodeCount codes of 10 base32 characters (50 random bits),
// shown as "xxxxx-xxxxx". Each replaces a TOTP code once at sign-in. They are stored as
// HMAC-SHA256 under a key derived from the master key: 50 bits are too few to resist an
// offline search of a plain hash, but without the master key a stolen table is useless.
//
// A user who lost both the device and the codes files a recovery request: recorded,
// audited and counted for operators (MFA readiness); nothing approves it automatically.

// RecoveryCodeCount is how many recovery codes a verify issues.
const RecoveryCodeCount = 10

const recoveryAlphabet = "abcdefghijklmnopqrstuvwxyz234567"

// newRecoveryCodes returns fresh codes and their hashes for userID.
func (s *Service) newRecoveryCodes(userID uuid.UUID) (codes []string, hashes [][]byte, err error) {
	for range RecoveryCodeCount {
		var raw [10]byte
		if _, err := rand.Read(raw[:]); err != nil {
			return nil, nil, fmt.Errorf("recovery code: %w", err)
		}
		var b strings.Builder
		for i, c := range raw {
			if i == 5 {
				b.WriteByte('-')
			}
			b.WriteByte(recoveryAlphabet[c&31])
		}
		code := b.String()
		codes = append(codes, code)
		hashes = append(hashes, s.recoveryCodeHash(userID, code))
	}
	return codes, hashes, nil
}

// recoveryCodeHash is what is stored of a code: HMAC-SHA256 of the user and the code
// normalized (lower case, no hyphen or spaces), so "ABCDE FGHIJ" matches "abcde-fghij".
func (s *Service) recoveryCodeHash(userID uuid.UUID, code string) []byte {
	norm := strings.Map(func(r rune) rune {
		if r == '-' || r == ' ' {
			return -1
		}
		return r
	}, strings.ToLower(strings.TrimSpace(code)))
	m := hmac.New(sha256.New, s.cfg.MasterKey.Derive("gantry/auth/recovery-codes"))
	m.Write([]byte(userID.String() + ":" + norm))
	return m.Sum(nil)
}

// RecoveryRequest is a support-assisted MFA recovery request.
type RecoveryRequest struct {
	ID        uuid.UUID
	Status    string
	CreatedAt time.Time
	// Existing is true when an open request was returned instead of a new one.
	Existing bool
}

// RequestMFARecovery records the caller's recovery request (or answers the open one).
func (s *Service) RequestMFARecovery(ctx context.Context, reason string) (RecoveryRequest, error) {
	p, err := humanUser(ctx)
	if err != nil {
		return RecoveryRequest{}, err
	}
	reason = strings.TrimSpace(reason)
	if reason == "" {
		return RecoveryRequest{}, apierr.New(apierr.ValidationError, "reason must not be blank").With("field", "reason")
	}
	tenant := uuid.NullUUID{UUID: p.TenantID, Valid: p.TenantID != uuid.Nil}
	var out RecoveryRequest
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := authdb.New(tx)
		row, err := q.InsertMFARecoveryRequest(ctx, authdb.InsertMFARecoveryRequestParams{
			ID: s.ids.New(), UserID: p.UserID, TenantID: tenant, Reason: reason, CreatedAt: s.clock.Now(),
		})
		if errors.Is(err, pgx.ErrNoRows) { // an open one exists
			open, err := q.GetOpenMFARecoveryRequest(ctx, p.UserID)
			if err != nil {
				return err
			}
			out = RecoveryRequest{ID: open.ID, Status: open.Status, CreatedAt: open.CreatedAt, Existing: true}
			return nil
		}
		if err != nil {
			return err
		}
		out = RecoveryRequest{ID: row.ID, Status: row.Status, CreatedAt: row.CreatedAt}
		// The reason is free text a person typed: kept in the request row for support,
		// not copied into the audit log.
		return s.audit.Record(ctx, tx, audit.Entry{
			Action: "mfa.recovery_request.create", TargetType: "mfa_recovery_request", TargetID: row.ID.String(),
			TenantID: p.TenantID, Metadata: map[string]any{"user_id": p.UserID.String()},
		})
	})
	if err != nil {
		return RecoveryRequest{}, apierr.Internal(fmt.Errorf("mfa recovery request: %w", err))
	}
	return out, nil
}

// Readiness is the MFA readiness read model (GET /api/v1/platform/iam/mfa-readiness).
type Readiness struct {
	Holders, WithoutMFA, PendingRecoveryRequests int
	ByRole                                       []RoleReadiness
}

// RoleReadiness counts one privileged platform role.
type RoleReadiness struct {
	Role                string
	Holders, WithoutMFA int
}

// MFAReadiness counts the holders of the privileged platform roles without MFA.
func (s *Service) MFAReadiness(ctx context.Context) (Readiness, error) {
	q := authdb.New(db.Querier(ctx, s.pool))
	tot, err := q.MFAReadinessTotals(ctx)
	if err != nil {
		return Readiness{}, apierr.Internal(fmt.Errorf("mfa readiness: %w", err))
	}
	rows, err := q.MFAReadiness(ctx)
	if err != nil {
		return Readiness{}, apierr.Internal(fmt.Errorf("mfa readiness: %w", err))
	}
	out := Readiness{Holders: int(tot.Holders), WithoutMFA: int(tot.WithoutMfa), PendingRecoveryRequests: int(tot.PendingRecoveryRequests)}
	for _, r := range rows {
		out.ByRole = append(out.ByRole, RoleReadiness{Role: r.Role, Holders: int(r.Holders), WithoutMFA: int(r.WithoutMfa)})
	}
	return out, nil
}
