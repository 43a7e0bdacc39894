package auth

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/auth/authdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// User administration (docs/api.md "Admin users"): platform admins list, read, disable,
// enable users and reset their MFA.
//
// Disabling ends a person's access as fast as the tokens allow: sign-in is refused
// (users.status), every refresh token is revoked in the same transaction (and refresh
// re-checks the status, so none works from that moment), and access tokens already
// issued run out within AccessTokenTTL. Enabling does not bring old sessions back.
// Resetting MFA needs step-up: it removes the second factor that protects the account.

// AdminUser is a user as platform admins see it.
type AdminUser = authdb.ListAdminUsersRow

// UserFilter narrows ListUsers.
type UserFilter struct {
	// Query is a substring of the username or display name (case-insensitive).
	Query    string
	TenantID uuid.UUID
	Status   string
}

// UserChange is a PATCH of a user: a new status ("" keeps it) and/or an MFA reset.
type UserChange struct {
	Status   string
	ResetMFA bool
}

// likeSubstring is q as an ILIKE pattern matching q anywhere, its wildcards escaped.
func likeSubstring(q string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return "%" + r.Replace(q) + "%"
}

// ListUsers is a page of users by id after after (uuid.Nil: the first page); more is
// true when another page follows.
func (s *Service) ListUsers(ctx context.Context, f UserFilter, after uuid.UUID, limit int) (users []AdminUser, more bool, err error) {
	p := authdb.ListAdminUsersParams{MaxRows: int32(limit + 1)}
	if after != uuid.Nil {
		p.After = uuid.NullUUID{UUID: after, Valid: true}
	}
	if f.Query != "" {
		q := likeSubstring(f.Query)
		p.Q = &q
	}
	if f.TenantID != uuid.Nil {
		p.TenantID = uuid.NullUUID{UUID: f.TenantID, Valid: true}
	}
	if f.Status != "" {
		p.Status = &f.Status
	}
	rows, err := authdb.New(db.Querier(ctx, s.pool)).ListAdminUsers(ctx, p)
	if err != nil {
		return nil, false, fmt.Errorf("list users: %w", err)
	}
	if len(rows) > limit {
		return rows[:limit], true, nil
	}
	return rows, false, nil
}

// GetUser is one user (404 user_not_found).
func (s *Service) GetUser(ctx context.Context, id uuid.UUID) (AdminUser, error) {
	row, err := authdb.New(db.Querier(ctx, s.pool)).GetAdminUser(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return AdminUser{}, apierr.New(apierr.UserNotFound, "no user %s", id)
	}
	if err != nil {
		return AdminUser{}, fmt.Errorf("get user: %w", err)
	}
	return AdminUser(row), nil
}

// UpdateUser applies c to user id, audited, in one transaction. A reset of MFA needs
// the caller's step-up (checked before anything changes).
func (s *Service) UpdateUser(ctx context.Context, id uuid.UUID, c UserChange) (AdminUser, error) {
	actor, ok := principal.From(ctx)
	if !ok {
		return AdminUser{}, apierr.New(apierr.TokenMissing, "authentication required")
	}
	if c.ResetMFA {
		if err := RequireStepUp(ctx); err != nil {
			return AdminUser{}, err
		}
	}
	var out AdminUser
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := authdb.New(tx)
		if c.Status == "disabled" {
			// The last-superadmin rule is decided under the role lock (platformroles.go).
			if err := q.LockPlatformRoles(ctx, platformRolesLockID); err != nil {
				return err
			}
		}
		cur, err := q.LockUser(ctx, id)
		if errors.Is(err, pgx.ErrNoRows) {
			return apierr.New(apierr.UserNotFound, "no user %s", id)
		}
		if err != nil {
			return err
		}
		now := s.clock.Now().UTC()
		entry := func(action string, meta map[string]any) audit.Entry {
			e := audit.Entry{Action: action, TargetType: "user", TargetID: id.String(), Metadata: meta}
			if cur.TenantID.Valid {
				e.TenantID = cur.TenantID.UUID
			}
			return e
		}
		if c.Status != "" && c.Status != cur.Status {
			switch c.Status {
			case "disabled":
				if id == actor.UserID {
					return apierr.New(apierr.InvalidRequest, "you cannot disable yourself").With("reason", "cannot_disable_self").WithStatus(409)
				}
				if err := keepASuperadmin(ctx, q, id); err != nil {
					return err
				}
				if err := q.SetUserStatus(ctx, authdb.SetUserStatusParams{ID: id, Status: "disabled", UpdatedAt: now}); err != nil {
					return err
				}
				n, err := q.RevokeUserRefreshTokens(ctx, authdb.RevokeUserRefreshTokensParams{UserID: id, RevokedAt: &now})
				if err != nil {
					return err
				}
				if err := s.audit.Record(ctx, tx, entry("user.disable", map[string]any{"revoked_refresh_tokens": n})); err != nil {
					return err
				}
			case "active":
				if err := q.SetUserStatus(ctx, authdb.SetUserStatusParams{ID: id, Status: "active", UpdatedAt: now}); err != nil {
					return err
				}
				if err := s.audit.Record(ctx, tx, entry("user.enable", nil)); err != nil {
					return err
				}
			default:
				return apierr.New(apierr.ValidationError, "unknown status %q", c.Status).With("field", "status")
			}
		}
		if c.ResetMFA {
			factor, err := q.DeleteTOTPFactor(ctx, id)
			if err != nil {
				return err
			}
			if err := q.DeleteRecoveryCodes(ctx, id); err != nil {
				return err
			}
			approved, err := q.ApproveOpenMFARecoveryRequest(ctx, authdb.ApproveOpenMFARecoveryRequestParams{UserID: id, DecidedAt: &now})
			if err != nil {
				return err
			}
			if err := s.audit.Record(ctx, tx, entry("user.mfa_reset", map[string]any{"factor_removed": factor == 1, "recovery_request_approved": approved == 1})); err != nil {
				return err
			}
		}
		row, err := q.GetAdminUser(ctx, id)
		out = AdminUser(row)
		return err
	})
	return out, err
}
