package tenancy_test

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

var platformAdmin = &principal.Principal{
	UserID: uuid.MustParse("01900000-0000-7000-8000-0000000000aa"), Username: "root",
	PlatformRole: []string{principal.RoleSuperadmin}, Capabilities: principal.CapabilitiesFor([]string{principal.RoleSuperadmin}),
}

func TestTenantsAdmin(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	acme := f.org("Acme", "alice")
	in := tenancy.ProvisionInput{Name: "Globex", Slug: "globex", DefaultCurrency: "EUR", AdminField: "admin.username",
		Admin: tenancy.NewUser{Username: "hank", Password: "correct horse battery", DisplayName: "Hank"}}

	_, err := f.svc.CreateTenant(ctx, adminOf(acme), in)
	wantCode(t, err, apierr.AdminRequired, 403)
	_, err = f.svc.ListTenants(ctx, adminOf(acme), uuid.Nil, 10)
	wantCode(t, err, apierr.AdminRequired, 403)

	out, err := f.svc.CreateTenant(ctx, platformAdmin, in)
	if err != nil || out.Tenant.Kind != tenancy.KindOrganization || out.Tenant.DefaultCurrency != "EUR" || out.Admin.DisplayName != "Hank" {
		t.Fatalf("create = %+v, %v", out, err)
	}

	tenants := f.count(`SELECT count(*) FROM tenants`)
	users := f.count(`SELECT count(*) FROM users`)
	in.Admin.Username = "hank2"
	_, err = f.svc.CreateTenant(ctx, platformAdmin, in)
	e := wantCode(t, err, apierr.InvalidRequest, 409)
	wantDetail(t, e, "reason", "slug_taken")
	in.Slug, in.Admin.Username = "globex-2", "alice"
	_, err = f.svc.CreateTenant(ctx, platformAdmin, in)
	e = wantCode(t, err, apierr.UserAlreadyExists, 409)
	wantDetail(t, e, "field", "admin.username")
	if f.count(`SELECT count(*) FROM tenants`) != tenants || f.count(`SELECT count(*) FROM users`) != users || f.audits("tenant.create") != 2 {
		t.Fatal("refused tenant creates persisted something")
	}

	pg, err := f.svc.ListTenants(ctx, platformAdmin, uuid.Nil, 1)
	if err != nil || len(pg.Items) != 1 || !pg.More || pg.Items[0].ID != acme.Tenant.ID {
		t.Fatalf("page 1 = %+v, %v", pg, err)
	}
	pg, err = f.svc.ListTenants(ctx, platformAdmin, pg.Items[0].ID, 1)
	if err != nil || len(pg.Items) != 1 || pg.More || pg.Items[0].ID != out.Tenant.ID {
		t.Fatalf("page 2 = %+v, %v", pg, err)
	}

	_, err = f.svc.GetTenant(ctx, platformAdmin, uuid.Must(uuid.NewV7()))
	wantCode(t, err, apierr.InvalidRequest, 404)

	if _, err := f.svc.UpdateTenant(ctx, platformAdmin, out.Tenant.ID, tenancy.TenantPatch{Name: ptr("Globex"), Status: ptr("active")}); err != nil {
		t.Fatal(err)
	}
	if f.audits("tenant.update") != 0 {
		t.Fatal("no-op tenant update was audited")
	}
	got, err := f.svc.UpdateTenant(ctx, platformAdmin, out.Tenant.ID, tenancy.TenantPatch{Status: ptr("disabled")})
	if err != nil || got.Status != "disabled" || f.audits("tenant.update") != 1 {
		t.Fatalf("update = %+v, %v (audits %d)", got, err, f.audits("tenant.update"))
	}
}

func TestUsers(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	acme := f.org("Acme", "alice")
	other := f.org("Other", "oscar")
	bob := f.user(acme, "bob")

	_, err := f.svc.CreateUser(ctx, bob, tenancy.NewUser{Username: "eve", Password: "correct horse battery", TenantRole: "member"})
	wantCode(t, err, apierr.InsufficientPermissions, 403)
	_, err = f.svc.ListUsers(ctx, bob, uuid.Nil, 10)
	wantCode(t, err, apierr.InsufficientPermissions, 403)
	_, err = f.svc.GetUser(ctx, bob, bob.UserID)
	wantCode(t, err, apierr.InsufficientPermissions, 403)

	users := f.count(`SELECT count(*) FROM users`)
	_, err = f.svc.CreateUser(ctx, adminOf(acme), tenancy.NewUser{Username: "oscar", Password: "correct horse battery", TenantRole: "member"})
	wantCode(t, err, apierr.UserAlreadyExists, 409)
	if f.count(`SELECT count(*) FROM users`) != users || f.audits("user.create") != 1 {
		t.Fatal("refused user create persisted something")
	}

	_, err = f.svc.GetUser(ctx, adminOf(acme), other.Admin.ID)
	wantCode(t, err, apierr.UserNotFound, 404)
	u, err := f.svc.GetUser(ctx, adminOf(acme), bob.UserID)
	if err != nil || u.Username != "bob" {
		t.Fatalf("get = %+v, %v", u, err)
	}
	pg, err := f.svc.ListUsers(ctx, adminOf(acme), uuid.Nil, 10)
	if err != nil || len(pg.Items) != 2 || pg.More {
		t.Fatalf("list = %+v, %v", pg, err)
	}
}

func TestDepartments(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	acme := f.org("Acme", "alice")
	other := f.org("Other", "oscar")
	bob := f.user(acme, "bob")
	admin := adminOf(acme)

	_, err := f.svc.CreateDepartment(ctx, bob, "Research", "research")
	wantCode(t, err, apierr.InsufficientPermissions, 403)
	d, err := f.svc.CreateDepartment(ctx, admin, "Research", "research")
	if err != nil || d.IsDefault || d.LifecycleState != "active" {
		t.Fatalf("create = %+v, %v", d, err)
	}
	_, err = f.svc.CreateDepartment(ctx, admin, "Research 2", "research")
	e := wantCode(t, err, apierr.InvalidRequest, 409)
	wantDetail(t, e, "field", "slug")
	if f.count(`SELECT count(*) FROM departments WHERE tenant_id = $1`, acme.Tenant.ID) != 2 || f.audits("department.create") != 1 {
		t.Fatal("refused department create persisted something")
	}

	// Tenant members read; another tenant's department is not found.
	if _, err := f.svc.GetDepartment(ctx, bob, d.ID); err != nil {
		t.Fatal(err)
	}
	_, err = f.svc.GetDepartment(ctx, bob, other.Department.ID)
	wantCode(t, err, apierr.InvalidRequest, 404)
	_, err = f.svc.UpdateDepartment(ctx, admin, other.Department.ID, tenancy.DepartmentPatch{DisplayName: ptr("Mine")})
	wantCode(t, err, apierr.InvalidRequest, 404)
	pg, err := f.svc.ListDepartments(ctx, bob, uuid.Nil, 50)
	if err != nil || len(pg.Items) != 2 {
		t.Fatalf("list = %+v, %v", pg, err)
	}

	_, err = f.svc.UpdateDepartment(ctx, bob, d.ID, tenancy.DepartmentPatch{DisplayName: ptr("R&D")})
	wantCode(t, err, apierr.InsufficientPermissions, 403)
	e = wantCode(t, func() error {
		_, err := f.svc.UpdateDepartment(ctx, admin, acme.Department.ID, tenancy.DepartmentPatch{LifecycleState: ptr("disabled")})
		return err
	}(), apierr.InvalidRequest, 409)
	wantDetail(t, e, "reason", "default_department")
	if _, err := f.svc.UpdateDepartment(ctx, admin, d.ID, tenancy.DepartmentPatch{DisplayName: ptr("Research")}); err != nil {
		t.Fatal(err)
	}
	if f.audits("department.update") != 0 {
		t.Fatal("no-op department update was audited")
	}
	got, err := f.svc.UpdateDepartment(ctx, admin, d.ID, tenancy.DepartmentPatch{DisplayName: ptr("R&D"), LifecycleState: ptr("disabled")})
	if err != nil || got.DisplayName != "R&D" || got.LifecycleState != "disabled" || f.audits("department.update") != 1 {
		t.Fatalf("update = %+v, %v", got, err)
	}
}
