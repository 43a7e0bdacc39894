package auth

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/auth/authdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Platform role bindings (seed §2.3, §5 rule 4; docs/api.md "Platform roles").
//
// A user's platform roles are the rows of platform_role_bindings, nothing else
// (platform_role_source bindings; migration 00550 turned users.role = 'admin' into
// superadmin bindings). Bind and revoke are admin operations that also need a fresh
// step-up (authz table, WithStepUp). Every change runs under one advisory lock, so the
// "keep one active platform_superadmin" rule holds under concurrent revocations and
// disables, and is audited in its own transaction.
//
// Roles travel in the access token: a change reaches the user's next access token
// (sign-in or refresh reload the bindings); a token issued before keeps its roles until
// it expires (AccessTokenTTL, 15 minutes by default). Disabling a user, by contrast,
// stops its refresh tokens at once.

// platformRolesLockID is the advisory lock of platform role changes.
const platformRolesLockID = 0x67616e7472790013 // "gantry" + issue 19

// PlatformRoles lists the roles in the contract's order.
var PlatformRoles = []string{principal.RoleSuperadmin, principal.RoleOps, principal.RoleUser}

// RoleBinding is one user bound to one platform role.
type RoleBinding = authdb.ListAllPlatformRoleBindingsRow

// roleMetrics are the seed's api_platform_role_* counters (§6.3).
type roleMetrics struct {
	list, bind, revoke, success, failure, denied, unavailable prometheus.Counter
}

func newRoleMetrics() roleMetrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	return roleMetrics{
		list:        c("api_platform_role_list_requests_total", "Platform role binding list requests that passed authorization."),
		bind:        c("api_platform_role_bind_requests_total", "Platform role bind requests that passed authorization."),
		revoke:      c("api_platform_role_revoke_requests_total", "Platform role revoke requests that passed authorization."),
		success:     c("api_platform_role_mutation_success_total", "Platform role binds and revokes that changed or confirmed a binding."),
		failure:     c("api_platform_role_mutation_failure_total", "Platform role binds and revokes refused or failed after authorization."),
		denied:      c("api_platform_role_admin_denied_total", "Platform role operations refused by authorization (admin_required, step_up_required, ...)."),
		unavailable: c("api_platform_role_service_unavailable_total", "Platform role operations answered service_unavailable because the role-binding store is unavailable (seed §7.3 rule 4)."),
	}
}

func (m roleMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.list, m.bind, m.revoke, m.success, m.failure, m.denied, m.unavailable}
}

// platformRoleOps are the operations the role counters describe.
var platformRoleOps = []string{"listPlatformRoleBindings", "createPlatformRoleBinding", "deletePlatformRoleBinding"}

// AuthorizationDenied counts a refusal of the authorization chain (server.Deps
// AuthzDenied): for the platform role operations it is api_platform_role_admin_denied_total.
func (s *Service) AuthorizationDenied(operationID string, _ error) {
	if slices.Contains(platformRoleOps, operationID) {
		s.roles.denied.Inc()
	}
}

// roleStoreError maps a failure of the role-binding store: the database not answering,
// or the table or a column of it missing (a schema that lacks it), is 503
// service_unavailable and counted (seed §7.3 rule 4); anything else is returned as is.
func (s *Service) roleStoreError(err error) error {
	if err == nil {
		return nil
	}
	var ae *apierr.Error
	if errors.As(err, &ae) {
		return err
	}
	var pe *pgconn.PgError
	missing := errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "42703" || pe.Code == "42883")
	if missing || db.IsUnavailable(err) {
		s.roles.unavailable.Inc()
		return apierr.New(apierr.ServiceUnavailable, "the platform role-binding store is unavailable; retry later").Wrap(err)
	}
	return err
}

// ListPlatformRoleBindings is every binding, by role then username.
func (s *Service) ListPlatformRoleBindings(ctx context.Context) ([]RoleBinding, error) {
	s.roles.list.Inc()
	rows, err := authdb.New(db.Querier(ctx, s.pool)).ListAllPlatformRoleBindings(ctx)
	if err != nil {
		return nil, s.roleStoreError(fmt.Errorf("list platform role bindings: %w", err))
	}
	return rows, nil
}

func validRole(role string) error {
	if !slices.Contains(PlatformRoles, role) {
		return apierr.New(apierr.ValidationError, "unknown platform role %q", role).With("field", "role")
	}
	return nil
}

// BindPlatformRole binds userID to role. created is false when the binding existed
// (nothing changes then, and nothing is audited).
func (s *Service) BindPlatformRole(ctx context.Context, role string, userID uuid.UUID) (b RoleBinding, created bool, err error) {
	s.roles.bind.Inc()
	defer func() { s.countMutation(err) }()
	if err := validRole(role); err != nil {
		return RoleBinding{}, false, err
	}
	actor, ok := principal.From(ctx)
	if !ok {
		return RoleBinding{}, false, apierr.New(apierr.TokenMissing, "authentication required")
	}
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := authdb.New(tx)
		if err := q.LockPlatformRoles(ctx, platformRolesLockID); err != nil {
			return err
		}
		if _, err := q.GetUserByID(ctx, userID); errors.Is(err, pgx.ErrNoRows) {
			return apierr.New(apierr.UserNotFound, "no user %s", userID)
		} else if err != nil {
			return err
		}
		now := s.clock.Now().UTC()
		n, err := q.InsertPlatformRoleBinding(ctx, authdb.InsertPlatformRoleBindingParams{
			UserID: userID, Role: role, GrantedBy: uuid.NullUUID{UUID: actor.UserID, Valid: true}, GrantedAt: now,
		})
		if err != nil {
			return err
		}
		created = n == 1
		if created && role == principal.RoleSuperadmin {
			if err := q.SetUserRole(ctx, authdb.SetUserRoleParams{ID: userID, Role: "admin", UpdatedAt: now}); err != nil {
				return err
			}
		}
		row, err := q.GetPlatformRoleBinding(ctx, authdb.GetPlatformRoleBindingParams{UserID: userID, Role: role})
		if err != nil {
			return err
		}
		b = RoleBinding(row)
		if !created {
			return nil
		}
		return s.audit.Record(ctx, tx, audit.Entry{
			Action: "platform_role.bind", TargetType: "user", TargetID: userID.String(),
			Metadata: map[string]any{"role": role},
		})
	})
	return b, created, s.roleStoreError(err)
}

// RevokePlatformRole removes userID's binding to role. The last active
// platform_superadmin stays (409 invalid_request, reason last_superadmin).
func (s *Service) RevokePlatformRole(ctx context.Context, role string, userID uuid.UUID) (err error) {
	s.roles.revoke.Inc()
	defer func() { s.countMutation(err) }()
	if err := validRole(role); err != nil {
		return err
	}
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := authdb.New(tx)
		if err := q.LockPlatformRoles(ctx, platformRolesLockID); err != nil {
			return err
		}
		if _, err := q.GetPlatformRoleBinding(ctx, authdb.GetPlatformRoleBindingParams{UserID: userID, Role: role}); errors.Is(err, pgx.ErrNoRows) {
			return apierr.New(apierr.InvalidRequest, "user %s is not bound to %s", userID, role).
				With("reason", "binding_not_found").WithStatus(404)
		} else if err != nil {
			return err
		}
		if role == principal.RoleSuperadmin {
			if err := keepASuperadmin(ctx, q, userID); err != nil {
				return err
			}
		}
		if _, err := q.DeletePlatformRoleBinding(ctx, authdb.DeletePlatformRoleBindingParams{UserID: userID, Role: role}); err != nil {
			return err
		}
		if role == principal.RoleSuperadmin {
			if err := q.SetUserRole(ctx, authdb.SetUserRoleParams{ID: userID, Role: "user", UpdatedAt: s.clock.Now().UTC()}); err != nil {
				return err
			}
		}
		return s.audit.Record(ctx, tx, audit.Entry{
			Action: "platform_role.revoke", TargetType: "user", TargetID: userID.String(),
			Metadata: map[string]any{"role": role},
		})
	})
	return s.roleStoreError(err)
}

// keepASuperadmin refuses taking userID out of the active superadmins when it is the
// last one (call under the platform roles lock). A user who is not an active
// superadmin can always go.
func keepASuperadmin(ctx context.Context, q *authdb.Queries, userID uuid.UUID) error {
	u, err := q.GetUserByID(ctx, userID)
	if err != nil {
		return err
	}
	if u.Status != "active" {
		return nil
	}
	if _, err := q.GetPlatformRoleBinding(ctx, authdb.GetPlatformRoleBindingParams{UserID: userID, Role: principal.RoleSuperadmin}); errors.Is(err, pgx.ErrNoRows) {
		return nil
	} else if err != nil {
		return err
	}
	n, err := q.CountActiveSuperadmins(ctx)
	if err != nil {
		return err
	}
	if n <= 1 {
		return apierr.New(apierr.InvalidRequest, "the platform must keep at least one active platform_superadmin").
			With("reason", "last_superadmin").WithStatus(409)
	}
	return nil
}

func (s *Service) countMutation(err error) {
	if err == nil {
		s.roles.success.Inc()
	} else {
		s.roles.failure.Inc()
	}
}
