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
)

// ListTenants is a page of every tenant, by id (platform admins).
func (s *Service) ListTenants(ctx context.Context, p *principal.Principal, after uuid.UUID, limit int) (Page[tenancydb.Tenant], error) {
	if err := requirePlatformAdmin(p); err != nil {
		return Page[tenancydb.Tenant]{}, err
	}
	rows, err := s.read(ctx).ListTenants(ctx, tenancydb.ListTenantsParams{After: afterID(after), Limit: int32(limit + 1)})
	if err != nil {
		return Page[tenancydb.Tenant]{}, fmt.Errorf("list tenants: %w", err)
	}
	return pageOf(rows, limit), nil
}

// CreateTenant provisions an organization with its first tenant admin (platform admins).
func (s *Service) CreateTenant(ctx context.Context, p *principal.Principal, in ProvisionInput) (Provisioned, error) {
	if err := requirePlatformAdmin(p); err != nil {
		return Provisioned{}, err
	}
	in.Kind = KindOrganization
	var out Provisioned
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		var err error
		out, err = s.Provision(ctx, tx, in)
		return err
	})
	return out, err
}

// GetTenant is one tenant (platform admins).
func (s *Service) GetTenant(ctx context.Context, p *principal.Principal, id uuid.UUID) (tenancydb.Tenant, error) {
	if err := requirePlatformAdmin(p); err != nil {
		return tenancydb.Tenant{}, err
	}
	t, err := s.read(ctx).GetTenant(ctx, id)
	if isNoRows(err) {
		return t, notFound("tenant")
	}
	if err != nil {
		return t, fmt.Errorf("get tenant: %w", err)
	}
	return t, nil
}

// TenantPatch is a partial tenant update; nil fields stay.
type TenantPatch struct {
	Name   *string
	Status *string
}

// UpdateTenant applies patch (platform admins). A patch that changes nothing writes
// nothing and audits nothing.
func (s *Service) UpdateTenant(ctx context.Context, p *principal.Principal, id uuid.UUID, patch TenantPatch) (tenancydb.Tenant, error) {
	if err := requirePlatformAdmin(p); err != nil {
		return tenancydb.Tenant{}, err
	}
	var out tenancydb.Tenant
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := tenancydb.New(tx)
		cur, err := q.GetTenantForUpdate(ctx, id)
		if isNoRows(err) {
			return notFound("tenant")
		}
		if err != nil {
			return fmt.Errorf("load tenant: %w", err)
		}
		next, changed := cur, map[string]any{}
		if patch.Name != nil && *patch.Name != cur.Name {
			next.Name, changed["name"] = *patch.Name, *patch.Name
		}
		if patch.Status != nil && *patch.Status != cur.Status {
			next.Status, changed["status"] = *patch.Status, *patch.Status
		}
		if len(changed) == 0 {
			out = cur
			return nil
		}
		out, err = q.UpdateTenant(ctx, tenancydb.UpdateTenantParams{ID: id, Name: next.Name, Status: next.Status, UpdatedAt: s.Clock.Now()})
		if err != nil {
			return fmt.Errorf("update tenant: %w", err)
		}
		return s.Audit.Record(ctx, tx, audit.Entry{
			Action: "tenant.update", TargetType: "tenant", TargetID: id.String(), TenantID: id, Metadata: changed,
		})
	})
	return out, err
}
