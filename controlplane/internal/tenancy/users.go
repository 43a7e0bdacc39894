package tenancy

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy/tenancydb"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// ListUsers is a page of the users of the caller's tenant, by id (tenant admins).
func (s *Service) ListUsers(ctx context.Context, p *principal.Principal, after uuid.UUID, limit int) (Page[tenancydb.User], error) {
	tenant, err := requireTenantAdmin(p)
	if err != nil {
		return Page[tenancydb.User]{}, err
	}
	rows, err := s.read(ctx).ListTenantUsers(ctx, tenancydb.ListTenantUsersParams{
		TenantID: uuid.NullUUID{UUID: tenant, Valid: true}, After: afterID(after), Limit: int32(limit + 1),
	})
	if err != nil {
		return Page[tenancydb.User]{}, fmt.Errorf("list users: %w", err)
	}
	return pageOf(rows, limit), nil
}

// CreateUser adds a user to the caller's tenant (tenant admins). A taken username is
// user_already_exists.
func (s *Service) CreateUser(ctx context.Context, p *principal.Principal, u NewUser) (tenancydb.User, error) {
	tenant, err := requireTenantAdmin(p)
	if err != nil {
		return tenancydb.User{}, err
	}
	var out tenancydb.User
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		out, err = s.insertUser(ctx, tenancydb.New(tx), tenant, u, "username")
		if err != nil {
			return err
		}
		return s.Audit.Record(ctx, tx, audit.Entry{
			Action: "user.create", TargetType: "user", TargetID: out.ID.String(), TenantID: tenant,
			Metadata: map[string]any{"username": out.Username, "tenant_role": u.TenantRole},
		})
	})
	return out, err
}

// GetUser is a user of the caller's tenant (tenant admins); a user of another tenant is
// user_not_found.
func (s *Service) GetUser(ctx context.Context, p *principal.Principal, id uuid.UUID) (tenancydb.User, error) {
	tenant, err := requireTenantAdmin(p)
	if err != nil {
		return tenancydb.User{}, err
	}
	u, err := s.read(ctx).GetTenantUser(ctx, tenancydb.GetTenantUserParams{ID: id, TenantID: uuid.NullUUID{UUID: tenant, Valid: true}})
	if isNoRows(err) {
		return u, apierr.NotFound(apierr.UserNotFound, "user")
	}
	if err != nil {
		return u, fmt.Errorf("get user: %w", err)
	}
	return u, nil
}
