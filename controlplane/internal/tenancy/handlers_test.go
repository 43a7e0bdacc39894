package tenancy_test

import (
	"context"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// The handlers must satisfy their slice of the generated interface.
var _ interface {
	GetMe(context.Context, api.GetMeRequestObject) (api.GetMeResponseObject, error)
	ListTenantUsers(context.Context, api.ListTenantUsersRequestObject) (api.ListTenantUsersResponseObject, error)
	CreateTenantUser(context.Context, api.CreateTenantUserRequestObject) (api.CreateTenantUserResponseObject, error)
	GetTenantUser(context.Context, api.GetTenantUserRequestObject) (api.GetTenantUserResponseObject, error)
	ListDepartments(context.Context, api.ListDepartmentsRequestObject) (api.ListDepartmentsResponseObject, error)
	CreateDepartment(context.Context, api.CreateDepartmentRequestObject) (api.CreateDepartmentResponseObject, error)
	GetDepartment(context.Context, api.GetDepartmentRequestObject) (api.GetDepartmentResponseObject, error)
	UpdateDepartment(context.Context, api.UpdateDepartmentRequestObject) (api.UpdateDepartmentResponseObject, error)
	ListProjects(context.Context, api.ListProjectsRequestObject) (api.ListProjectsResponseObject, error)
	CreateProject(context.Context, api.CreateProjectRequestObject) (api.CreateProjectResponseObject, error)
	GetProject(context.Context, api.GetProjectRequestObject) (api.GetProjectResponseObject, error)
	UpdateProject(context.Context, api.UpdateProjectRequestObject) (api.UpdateProjectResponseObject, error)
	DeleteProject(context.Context, api.DeleteProjectRequestObject) (api.DeleteProjectResponseObject, error)
	ListProjectMembers(context.Context, api.ListProjectMembersRequestObject) (api.ListProjectMembersResponseObject, error)
	AddProjectMember(context.Context, api.AddProjectMemberRequestObject) (api.AddProjectMemberResponseObject, error)
	UpdateProjectMember(context.Context, api.UpdateProjectMemberRequestObject) (api.UpdateProjectMemberResponseObject, error)
	RemoveProjectMember(context.Context, api.RemoveProjectMemberRequestObject) (api.RemoveProjectMemberResponseObject, error)
	ListTenants(context.Context, api.ListTenantsRequestObject) (api.ListTenantsResponseObject, error)
	CreateTenant(context.Context, api.CreateTenantRequestObject) (api.CreateTenantResponseObject, error)
	GetTenant(context.Context, api.GetTenantRequestObject) (api.GetTenantResponseObject, error)
	UpdateTenant(context.Context, api.UpdateTenantRequestObject) (api.UpdateTenantResponseObject, error)
} = (*tenancy.Handlers)(nil)

func TestGetMe(t *testing.T) {
	f := newFixture(t)
	acme := f.org("Acme", "alice")
	if _, err := f.pool.Exec(context.Background(), `UPDATE tenants SET default_currency = 'EUR' WHERE id = $1`, acme.Tenant.ID); err != nil {
		t.Fatal(err)
	}
	h := tenancy.NewHandlers(f.svc, tenancy.ZeroBalance{Pool: f.pool}, pagination.Codec{Key: []byte("k")})
	p := adminOf(acme)
	p.PlatformRole, p.Capabilities = []string{principal.RoleOps}, principal.CapabilitiesFor([]string{principal.RoleOps})
	res, err := h.GetMe(principal.With(context.Background(), p), api.GetMeRequestObject{})
	if err != nil {
		t.Fatal(err)
	}
	me := res.(api.GetMe200JSONResponse).Body
	if me.Username != "alice" || me.Role != api.UserRole("user") || *me.OrgID != acme.Tenant.ID || *me.OrgName != "Acme" ||
		*me.ProjectID != acme.Project.ID || *me.ProjectName != "Default" || me.Balance != (api.Money{AmountMinor: 0, Currency: "EUR"}) ||
		len(me.PlatformRoles) != 1 || len(me.PlatformCapabilities) != 5 || me.PlatformRoleSource != "bindings" {
		t.Fatalf("me = %+v", me)
	}

	// A platform user outside any tenant: nulls and a zero balance in the default currency.
	root := f.rootUser()
	res, err = h.GetMe(principal.With(context.Background(), root), api.GetMeRequestObject{})
	if err != nil {
		t.Fatal(err)
	}
	me = res.(api.GetMe200JSONResponse).Body
	if me.OrgID != nil || me.ProjectID != nil || me.OrgName != nil || me.Role != "admin" || me.Balance.Currency != "USD" ||
		me.PlatformRoles == nil || me.PlatformCapabilities == nil {
		t.Fatalf("root me = %+v", me)
	}
}

func TestHandlersPaginateAndNeedProjectContext(t *testing.T) {
	f := newFixture(t)
	for _, n := range []string{"A", "B", "C"} {
		f.org("Org "+n, "admin"+n)
	}
	h := tenancy.NewHandlers(f.svc, tenancy.ZeroBalance{Pool: f.pool}, pagination.Codec{Key: []byte("k")})
	ctx := principal.With(context.Background(), platformAdmin)
	size := 2
	res, err := h.ListTenants(ctx, api.ListTenantsRequestObject{Params: api.ListTenantsParams{PageSize: &size}})
	if err != nil {
		t.Fatal(err)
	}
	page1 := res.(api.ListTenants200JSONResponse).Body
	if len(page1.Items) != 2 || page1.Pagination.NextCursor == nil || page1.Pagination.PageSize != 2 {
		t.Fatalf("page 1 = %+v", page1)
	}
	res, err = h.ListTenants(ctx, api.ListTenantsRequestObject{Params: api.ListTenantsParams{PageSize: &size, Cursor: page1.Pagination.NextCursor}})
	if err != nil {
		t.Fatal(err)
	}
	page2 := res.(api.ListTenants200JSONResponse).Body
	if len(page2.Items) != 1 || page2.Pagination.NextCursor != nil || page2.Items[0].ID == page1.Items[1].ID {
		t.Fatalf("page 2 = %+v", page2)
	}
	// A cursor of one listing is refused by another.
	_, err = h.ListDepartments(principal.With(context.Background(), adminOf(f.org("Org D", "adminD"))),
		api.ListDepartmentsRequestObject{Params: api.ListDepartmentsParams{Cursor: page1.Pagination.NextCursor}})
	wantCode(t, err, apierr.InvalidRequest, 400)

	// A project-path operation without the chain's project context is invalid_request.
	_, err = h.GetProject(ctx, api.GetProjectRequestObject{ProjectID: page1.Items[0].ID})
	wantCode(t, err, apierr.InvalidRequest, 400)
	_, err = h.DeleteProject(projectctx.With(ctx, projectctx.Project{ID: page1.Items[1].ID}), api.DeleteProjectRequestObject{ProjectID: page1.Items[0].ID})
	wantCode(t, err, apierr.InvalidRequest, 400)
}
