package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/auth/authdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// RefreshTokenPrefix marks Gantry refresh tokens, so they are recognizable in a leak
// scanner and never mistaken for an access token.
const RefreshTokenPrefix = "grt_"

// refreshTokenBytes of randomness: 256 bits, beyond guessing.
const refreshTokenBytes = 32

func errRefreshInvalid(cause error) *apierr.Error {
	return apierr.New(apierr.TokenInvalid, "refresh token is invalid").Wrap(cause)
}

func errRefreshExpired() *apierr.Error {
	return apierr.New(apierr.TokenExpired, "refresh token has expired")
}

// hashRefreshToken is what the database stores of a refresh token. The token carries
// 256 random bits, so a plain SHA-256 (no salt, no stretching) cannot be inverted, and it
// keeps lookups an index probe.
func hashRefreshToken(token string) []byte {
	sum := sha256.Sum256([]byte(token))
	return sum[:]
}

// insertRefreshToken mints a refresh token of family for userID and stores its hash.
func (s *Service) insertRefreshToken(ctx context.Context, q *authdb.Queries, userID, family uuid.UUID) (string, time.Time, error) {
	raw := make([]byte, refreshTokenBytes)
	if _, err := rand.Read(raw); err != nil {
		return "", time.Time{}, fmt.Errorf("refresh token randomness: %w", err)
	}
	token := RefreshTokenPrefix + base64.RawURLEncoding.EncodeToString(raw)
	now := s.clock.Now()
	exp := now.Add(s.cfg.RefreshTokenTTL)
	err := q.InsertRefreshToken(ctx, authdb.InsertRefreshTokenParams{
		ID: s.ids.New(), TokenHash: hashRefreshToken(token), FamilyID: family, UserID: userID,
		CreatedAt: now, ExpiresAt: exp,
	})
	if err != nil {
		return "", time.Time{}, fmt.Errorf("insert refresh token: %w", err)
	}
	return token, exp, nil
}

// Refresh spends a refresh token and issues the next one of its family with a new
// access token. A token presented a second time is reuse: the whole family (including
// its newest token) is revoked, the event is audited, and the answer is token_invalid.
// So of concurrent refreshes of one token exactly one succeeds, and the others revoke
// the family — a legitimate client never refreshes one token twice. An expired token is
// token_expired; an unknown or revoked one token_invalid; a disabled user's family is
// revoked and answered token_invalid.
func (s *Service) Refresh(ctx context.Context, token string) (AuthTokens, error) {
	if !strings.HasPrefix(token, RefreshTokenPrefix) {
		return AuthTokens{}, errRefreshInvalid(errors.New("not a refresh token"))
	}
	var (
		out AuthTokens
		// failAfterCommit: the transaction commits (a revocation) and the call still fails.
		failAfterCommit error
	)
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := authdb.New(tx)
		row, err := q.GetRefreshTokenForUpdate(ctx, hashRefreshToken(token))
		if errors.Is(err, pgx.ErrNoRows) {
			return errRefreshInvalid(errors.New("unknown refresh token"))
		}
		if err != nil {
			return fmt.Errorf("load refresh token: %w", err)
		}
		now := s.clock.Now()
		switch {
		case row.RevokedAt != nil:
			return errRefreshInvalid(errors.New("refresh token revoked"))
		case row.UsedAt != nil:
			failAfterCommit = errRefreshInvalid(errors.New("refresh token reused"))
			return s.revokeForReuse(ctx, tx, row, now)
		case !now.Before(row.ExpiresAt):
			return errRefreshExpired()
		}
		if err := q.MarkRefreshTokenUsed(ctx, authdb.MarkRefreshTokenUsedParams{ID: row.ID, UsedAt: &now}); err != nil {
			return fmt.Errorf("spend refresh token: %w", err)
		}
		out, err = s.issueTx(ctx, tx, row.UserID, row.FamilyID)
		if errors.Is(err, errInactive) {
			failAfterCommit = errRefreshInvalid(err)
			_, err = q.RevokeRefreshFamily(ctx, authdb.RevokeRefreshFamilyParams{RevokedAt: &now, FamilyID: row.FamilyID})
			out = AuthTokens{}
		}
		return err
	})
	if err != nil {
		if _, ok := apierr.As(err); !ok {
			err = apierr.Internal(err)
		}
		return AuthTokens{}, err
	}
	if failAfterCommit != nil {
		return AuthTokens{}, failAfterCommit
	}
	return out, nil
}

// revokeForReuse revokes row's family and audits the reuse.
func (s *Service) revokeForReuse(ctx context.Context, tx pgx.Tx, row authdb.GetRefreshTokenForUpdateRow, now time.Time) error {
	q := authdb.New(tx)
	n, err := q.RevokeRefreshFamily(ctx, authdb.RevokeRefreshFamilyParams{RevokedAt: &now, FamilyID: row.FamilyID})
	if err != nil {
		return fmt.Errorf("revoke refresh family: %w", err)
	}
	var tenant uuid.UUID
	if u, err := q.GetUserByID(ctx, row.UserID); err == nil && u.TenantID.Valid {
		tenant = u.TenantID.UUID
	}
	return s.audit.Record(ctx, tx, audit.Entry{
		Action: "auth.refresh_reuse_detected", TargetType: "user", TargetID: row.UserID.String(),
		TenantID: tenant, Result: audit.Failure, ActorType: audit.ActorSystem,
		Metadata: map[string]any{"family_id": row.FamilyID.String(), "revoked_tokens": n},
	})
}

// Logout revokes the family of a refresh token. It is idempotent and answers nothing
// about the token: an unknown, already revoked, or (when ctx carries a principal)
// another user's token leaves everything as it was and returns nil.
func (s *Service) Logout(ctx context.Context, token string) error {
	if !strings.HasPrefix(token, RefreshTokenPrefix) {
		return nil
	}
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := authdb.New(tx)
		row, err := q.GetRefreshTokenForUpdate(ctx, hashRefreshToken(token))
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("load refresh token: %w", err)
		}
		if p, ok := principal.From(ctx); ok && p.UserID != row.UserID {
			return nil
		}
		now := s.clock.Now()
		n, err := q.RevokeRefreshFamily(ctx, authdb.RevokeRefreshFamilyParams{RevokedAt: &now, FamilyID: row.FamilyID})
		if err != nil {
			return fmt.Errorf("revoke refresh family: %w", err)
		}
		if n == 0 {
			return nil // already revoked: nothing changed, nothing to audit
		}
		var tenant uuid.UUID
		if p, ok := principal.From(ctx); ok {
			tenant = p.TenantID
		}
		return s.audit.Record(ctx, tx, audit.Entry{
			Action: "user.logout", TargetType: "user", TargetID: row.UserID.String(), TenantID: tenant,
			Metadata: map[string]any{"family_id": row.FamilyID.String(), "revoked_tokens": n},
		})
	})
	if err != nil {
		return apierr.Internal(err)
	}
	return nil
}

// PurgeExpiredRefreshTokens deletes refresh tokens that expired before before (a
// periodic job: expired rows only answer token_expired, which unknown would do too).
func (s *Service) PurgeExpiredRefreshTokens(ctx context.Context, before time.Time) (int64, error) {
	return authdb.New(s.pool).DeleteExpiredRefreshTokens(ctx, before)
}
