package tenancy

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy/tenancydb"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Access resolves the project context of a project-scoped request: the project and the
// caller's role there. The role is the caller's membership role, raised to at least
// admin for a tenant admin of the project's tenant. A project that does not exist, that
// belongs to another tenant, or where the caller has no role is insufficient_permissions
// alike, so the answer never reveals whether the project exists. A deleted project is one
// that does not exist (its row stays for its history; ProjectAccess reads live rows only).
//
// It runs on every project-scoped request: one query, two primary-key probes.
func (s *Service) Access(ctx context.Context, p *principal.Principal, projectID uuid.UUID) (projectctx.Project, error) {
	deny := noProjectAccess()
	if p == nil || p.TenantID == uuid.Nil {
		return projectctx.Project{}, deny
	}
	row, err := s.read(ctx).ProjectAccess(ctx, tenancydb.ProjectAccessParams{UserID: p.UserID, ProjectID: projectID})
	if isNoRows(err) {
		return projectctx.Project{}, deny
	}
	if err != nil {
		return projectctx.Project{}, fmt.Errorf("project access: %w", err)
	}
	if row.TenantID != p.TenantID {
		return projectctx.Project{}, deny
	}
	role := row.MemberRole
	if p.Machine != nil {
		// A machine identity's role is the one its token grants in this project, nothing
		// else (it is nobody's member and no tenant admin); a project outside its token is
		// refused like any project without access.
		role = p.Machine.Projects[row.ID]
	} else if p.IsTenantAdmin(row.TenantID) {
		role = projectctx.Stronger(role, projectctx.RoleAdmin)
	}
	if role == "" {
		return projectctx.Project{}, deny
	}
	return projectctx.Project{
		ID: row.ID, TenantID: row.TenantID, Role: role, IsDefault: row.IsDefault, Department: row.DepartmentID,
		Name: row.Name, Slug: row.Slug, TenantName: row.TenantName, DepartmentName: row.DepartmentName,
		DepartmentSlug: row.DepartmentSlug, CreatedAt: row.CreatedAt, UpdatedAt: row.UpdatedAt,
	}, nil
}

// noProjectAccess is the one answer for a project the caller may not act in, whatever
// the reason: no such project, a deleted one, another tenant's, no role there.
func noProjectAccess() *apierr.Error {
	return apierr.Forbidden("you do not have access to this project")
}
