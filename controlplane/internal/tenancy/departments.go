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

// Department lifecycle states.
const (
	DepartmentActive   = "active"
	DepartmentDisabled = "disabled"
)

// ListDepartments is a page of the departments of the caller's tenant (tenant members).
func (s *Service) ListDepartments(ctx context.Context, p *principal.Principal, after uuid.UUID, limit int) (Page[tenancydb.Department], error) {
	tenant, err := tenantOf(p)
	if err != nil {
		return Page[tenancydb.Department]{}, err
	}
	rows, err := s.read(ctx).ListDepartments(ctx, tenancydb.ListDepartmentsParams{TenantID: tenant, After: afterID(after), Limit: int32(limit + 1)})
	if err != nil {
		return Page[tenancydb.Department]{}, fmt.Errorf("list departments: %w", err)
	}
	return pageOf(rows, limit), nil
}

// GetDepartment is a department of the caller's tenant (tenant members).
func (s *Service) GetDepartment(ctx context.Context, p *principal.Principal, id uuid.UUID) (tenancydb.Department, error) {
	tenant, err := tenantOf(p)
	if err != nil {
		return tenancydb.Department{}, err
	}
	d, err := s.read(ctx).GetDepartment(ctx, tenancydb.GetDepartmentParams{ID: id, TenantID: tenant})
	if isNoRows(err) {
		return d, notFound("department")
	}
	if err != nil {
		return d, fmt.Errorf("get department: %w", err)
	}
	return d, nil
}

// CreateDepartment adds a department to the caller's tenant (tenant admins).
func (s *Service) CreateDepartment(ctx context.Context, p *principal.Principal, displayName, slug string) (tenancydb.Department, error) {
	tenant, err := requireTenantAdmin(p)
	if err != nil {
		return tenancydb.Department{}, err
	}
	var out tenancydb.Department
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		out, err = tenancydb.New(tx).InsertDepartment(ctx, tenancydb.InsertDepartmentParams{
			ID: s.IDs.New(), TenantID: tenant, DisplayName: displayName, Slug: slug, CreatedAt: s.Clock.Now(),
		})
		if isNoRows(err) {
			return slugTaken("department")
		}
		if err != nil {
			return fmt.Errorf("insert department: %w", err)
		}
		return s.Audit.Record(ctx, tx, audit.Entry{
			Action: "department.create", TargetType: "department", TargetID: out.ID.String(), TenantID: tenant,
			Metadata: map[string]any{"slug": slug},
		})
	})
	return out, err
}

// DepartmentPatch is a partial department update; nil fields stay.
type DepartmentPatch struct {
	DisplayName    *string
	LifecycleState *string
}

// UpdateDepartment applies patch (tenant admins). The default department cannot be
// disabled; a patch that changes nothing writes nothing.
func (s *Service) UpdateDepartment(ctx context.Context, p *principal.Principal, id uuid.UUID, patch DepartmentPatch) (tenancydb.Department, error) {
	tenant, err := requireTenantAdmin(p)
	if err != nil {
		return tenancydb.Department{}, err
	}
	var out tenancydb.Department
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := tenancydb.New(tx)
		cur, err := q.GetDepartmentForUpdate(ctx, tenancydb.GetDepartmentForUpdateParams{ID: id, TenantID: tenant})
		if isNoRows(err) {
			return notFound("department")
		}
		if err != nil {
			return fmt.Errorf("load department: %w", err)
		}
		next, changed := cur, map[string]any{}
		if patch.DisplayName != nil && *patch.DisplayName != cur.DisplayName {
			next.DisplayName, changed["display_name"] = *patch.DisplayName, *patch.DisplayName
		}
		if patch.LifecycleState != nil && *patch.LifecycleState != cur.LifecycleState {
			if cur.IsDefault && *patch.LifecycleState == DepartmentDisabled {
				return conflict("default_department", "the default department cannot be disabled").With("field", "lifecycle_state")
			}
			next.LifecycleState, changed["lifecycle_state"] = *patch.LifecycleState, *patch.LifecycleState
		}
		if len(changed) == 0 {
			out = cur
			return nil
		}
		out, err = q.UpdateDepartment(ctx, tenancydb.UpdateDepartmentParams{
			ID: id, TenantID: tenant, DisplayName: next.DisplayName, LifecycleState: next.LifecycleState, UpdatedAt: s.Clock.Now(),
		})
		if err != nil {
			return fmt.Errorf("update department: %w", err)
		}
		return s.Audit.Record(ctx, tx, audit.Entry{
			Action: "department.update", TargetType: "department", TargetID: id.String(), TenantID: tenant, Metadata: changed,
		})
	})
	return out, err
}
