package tenancy_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/proto/api"
)

type httpResponse interface{ StatusCode() int }

// wantError asserts an error response's status, code and (when set) details.reason.
func wantError(t *testing.T, resp httpResponse, body []byte, status int, code, reason string) {
	t.Helper()
	if resp.StatusCode() != status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode(), status, body)
	}
	var e api.ErrorResponse
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body: %v: %s", err, body)
	}
	if string(e.Code) != code || (reason != "" && e.Details["reason"] != reason) {
		t.Fatalf("error %s/%v, want %s/%s: %s", e.Code, e.Details["reason"], code, reason, body)
	}
}

func wantStatus(t *testing.T, resp httpResponse, body []byte, status int) {
	t.Helper()
	if resp.StatusCode() != status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode(), status, body)
	}
}

func TestAPITenancy(t *testing.T) {
	env := apitest.New(t)
	ctx := context.Background()
	_, rootToken := env.PlatformAdmin(t)
	acme := env.NewTenant(t, rootToken, "Acme")
	other := env.NewTenant(t, rootToken, "Other")
	admin := env.Client(acme.AdminToken)
	bobID, bobToken := env.NewUser(t, acme.AdminToken, "member")
	bob := env.Client(bobToken)

	// Admin operations need a platform admin.
	lt, err := admin.ListTenantsWithResponse(ctx, &api.ListTenantsParams{})
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, lt, lt.Body, 403, "admin_required", "")

	me, err := bob.GetMeWithResponse(ctx, &api.GetMeParams{})
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, me, me.Body, 200)
	if *me.JSON200.OrgID != acme.ID || *me.JSON200.ProjectID != acme.DefaultProject || me.JSON200.Balance.Currency != "USD" {
		t.Fatalf("me = %+v", me.JSON200)
	}

	// Tenant users: admins only; another tenant's user is not found.
	gu, err := bob.GetTenantUserWithResponse(ctx, bobID, &api.GetTenantUserParams{})
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, gu, gu.Body, 403, "insufficient_permissions", "")
	gu, err = admin.GetTenantUserWithResponse(ctx, other.AdminID, &api.GetTenantUserParams{})
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, gu, gu.Body, 404, "user_not_found", "")

	// Departments.
	cd, err := admin.CreateDepartmentWithResponse(ctx, &api.CreateDepartmentParams{}, api.CreateDepartmentJSONRequestBody{DisplayName: "Research", Slug: "research"})
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, cd, cd.Body, 201)
	cd, err = admin.CreateDepartmentWithResponse(ctx, &api.CreateDepartmentParams{}, api.CreateDepartmentJSONRequestBody{DisplayName: "Again", Slug: "research"})
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, cd, cd.Body, 409, "invalid_request", "slug_taken")

	// Projects: any tenant member creates and owns; another tenant's department is 404.
	cp, err := bob.CreateProjectWithResponse(ctx, &api.CreateProjectParams{}, api.CreateProjectJSONRequestBody{Name: "Bob's Project"})
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, cp, cp.Body, 201)
	proj := cp.JSON201.Project
	if proj.Role != "owner" || proj.Slug != "bob-s-project" || proj.DepartmentID != acme.DefaultDept {
		t.Fatalf("project = %+v", proj)
	}
	dept := other.DefaultDept
	cp, err = bob.CreateProjectWithResponse(ctx, &api.CreateProjectParams{}, api.CreateProjectJSONRequestBody{Name: "X", DepartmentID: &dept})
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, cp, cp.Body, 404, "invalid_request", "not_found")

	// Another tenant cannot see the project; the tenant admin sees it as admin.
	gp, err := env.Client(other.AdminToken).GetProjectWithResponse(ctx, proj.ID, &api.GetProjectParams{})
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, gp, gp.Body, 403, "insufficient_permissions", "")
	gp, err = admin.GetProjectWithResponse(ctx, proj.ID, &api.GetProjectParams{})
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, gp, gp.Body, 200)
	if gp.JSON200.Role != "admin" {
		t.Fatalf("tenant admin role = %s", gp.JSON200.Role)
	}
	lp, err := admin.ListProjectsWithResponse(ctx, &api.ListProjectsParams{})
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, lp, lp.Body, 200)
	if len(lp.JSON200.Items) != 2 {
		t.Fatalf("admin lists %d projects", len(lp.JSON200.Items))
	}

	name := "Renamed"
	up, err := admin.UpdateProjectWithResponse(ctx, proj.ID, &api.UpdateProjectParams{}, api.UpdateProjectJSONRequestBody{Name: &name})
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, up, up.Body, 200)

	// Members: the last owner stays.
	am, err := bob.AddProjectMemberWithResponse(ctx, proj.ID, &api.AddProjectMemberParams{}, api.AddProjectMemberJSONRequestBody{UserID: other.AdminID, Role: "viewer"})
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, am, am.Body, 404, "user_not_found", "")
	am, err = bob.AddProjectMemberWithResponse(ctx, proj.ID, &api.AddProjectMemberParams{}, api.AddProjectMemberJSONRequestBody{UserID: acme.AdminID, Role: "viewer"})
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, am, am.Body, 201)
	am, err = bob.AddProjectMemberWithResponse(ctx, proj.ID, &api.AddProjectMemberParams{}, api.AddProjectMemberJSONRequestBody{UserID: acme.AdminID, Role: "viewer"})
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, am, am.Body, 409, "user_already_exists", "")
	um, err := bob.UpdateProjectMemberWithResponse(ctx, proj.ID, bobID, &api.UpdateProjectMemberParams{}, api.UpdateProjectMemberJSONRequestBody{Role: "admin"})
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, um, um.Body, 409, "invalid_request", "last_owner")
	rm, err := bob.RemoveProjectMemberWithResponse(ctx, proj.ID, bobID, &api.RemoveProjectMemberParams{})
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, rm, rm.Body, 409, "invalid_request", "last_owner")
	lm, err := admin.ListProjectMembersWithResponse(ctx, proj.ID, &api.ListProjectMembersParams{})
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, lm, lm.Body, 200)
	if len(lm.JSON200.Items) != 2 {
		t.Fatalf("members = %+v", lm.JSON200.Items)
	}

	// Delete: the tenant admin is not an owner; the default project stays; the owner deletes.
	dp, err := admin.DeleteProjectWithResponse(ctx, proj.ID, &api.DeleteProjectParams{})
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, dp, dp.Body, 403, "insufficient_permissions", "")
	dp, err = admin.DeleteProjectWithResponse(ctx, acme.DefaultProject, &api.DeleteProjectParams{})
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, dp, dp.Body, 409, "invalid_request", "default_project")
	dp, err = bob.DeleteProjectWithResponse(ctx, proj.ID, &api.DeleteProjectParams{})
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, dp, dp.Body, 200)
	if !dp.JSON200.Ok || dp.JSON200.ProjectID != proj.ID {
		t.Fatalf("delete = %+v", dp.JSON200)
	}
	gp, err = bob.GetProjectWithResponse(ctx, uuid.UUID(proj.ID), &api.GetProjectParams{})
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, gp, gp.Body, 403, "insufficient_permissions", "")
	if env.Validated.Load() == 0 {
		t.Fatal("no response was validated against the contract")
	}
}
