package tenancy

import (
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy/tenancydb"
	"github.com/gantry-gpu/gantry/proto/api"
)

func apiTenant(t tenancydb.Tenant) api.Tenant {
	return api.Tenant{
		ID: t.ID, Name: t.Name, Slug: t.Slug, DefaultCurrency: t.DefaultCurrency,
		Status: api.TenantStatus(t.Status), CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt,
	}
}

func apiTenantUser(u tenancydb.User) api.TenantUser {
	role := ""
	if u.TenantRole != nil {
		role = *u.TenantRole
	}
	return api.TenantUser{
		ID: u.ID, Username: u.Username, DisplayName: u.DisplayName, OrgID: u.TenantID.UUID,
		TenantRole: api.TenantRole(role), CreatedAt: u.CreatedAt,
	}
}

func apiDepartment(d tenancydb.Department) api.Department {
	return api.Department{
		ID: d.ID, OrgID: d.TenantID, DisplayName: d.DisplayName, Slug: d.Slug, IsDefault: d.IsDefault,
		LifecycleState: api.DepartmentLifecycleState(d.LifecycleState), CreatedAt: d.CreatedAt, UpdatedAt: d.UpdatedAt,
	}
}

func apiProject(p Project) api.Project {
	return api.Project{
		ID: p.ID, OrgID: p.TenantID, OrgName: p.TenantName, DepartmentID: p.DepartmentID,
		DepartmentName: p.DepartmentName, DepartmentSlug: p.DepartmentSlug, Name: p.Name, Slug: p.Slug,
		Role: api.ProjectRole(p.Role), IsDefault: p.IsDefault, CreatedAt: p.CreatedAt,
	}
}

func apiMember(m Member) api.ProjectMember {
	return api.ProjectMember{
		MemberID: m.UserID, ProjectID: m.ProjectID, UserID: m.UserID, Username: m.Username,
		Role: api.ProjectRole(m.Role), CreatedAt: m.CreatedAt,
	}
}
