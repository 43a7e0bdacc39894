package tenancy_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

func TestProvisionCreatesExactlyOneDefaultDepartmentAndProject(t *testing.T) {
	f := newFixture(t)
	p := f.org("Acme Research", "alice")

	if p.Tenant.Slug != "acme-research" || p.Tenant.Kind != tenancy.KindOrganization || p.Tenant.DefaultCurrency != "USD" {
		t.Fatalf("tenant = %+v", p.Tenant)
	}
	if got := f.count(`SELECT count(*) FROM departments WHERE tenant_id = $1`, p.Tenant.ID); got != 1 {
		t.Fatalf("departments = %d, want 1", got)
	}
	if got := f.count(`SELECT count(*) FROM departments WHERE tenant_id = $1 AND is_default AND slug = 'default'`, p.Tenant.ID); got != 1 {
		t.Fatalf("default departments = %d, want 1", got)
	}
	if got := f.count(`SELECT count(*) FROM projects WHERE tenant_id = $1`, p.Tenant.ID); got != 1 {
		t.Fatalf("projects = %d, want 1", got)
	}
	if got := f.count(`SELECT count(*) FROM projects WHERE tenant_id = $1 AND is_default AND slug = 'default' AND department_id = $2`, p.Tenant.ID, p.Department.ID); got != 1 {
		t.Fatalf("default projects in the default department = %d, want 1", got)
	}
	if got := f.count(`SELECT count(*) FROM users WHERE tenant_id = $1 AND tenant_role = 'admin' AND password_hash = 'test$correct horse battery'`, p.Tenant.ID); got != 1 {
		t.Fatalf("tenant admins with hashed password = %d, want 1", got)
	}
	if got := f.count(`SELECT count(*) FROM project_members WHERE project_id = $1 AND user_id = $2 AND role = 'owner'`, p.Project.ID, p.Admin.ID); got != 1 {
		t.Fatalf("admin owns default project: %d", got)
	}
	if p.Project.Role != "owner" || !p.Project.IsDefault || p.Project.TenantName != "Acme Research" || p.Project.DepartmentSlug != "default" {
		t.Fatalf("project = %+v", p.Project)
	}
	if f.audits("tenant.create") != 1 || f.events(tenancy.EventTenantCreated) != 1 || f.events(tenancy.EventProjectCreated) != 1 {
		t.Fatalf("audit/outbox rows: audit=%d tenant.created=%d project.created=%d",
			f.audits("tenant.create"), f.events(tenancy.EventTenantCreated), f.events(tenancy.EventProjectCreated))
	}
	if got := f.count(`SELECT count(*) FROM outbox_events WHERE subject = 'gantry.events.tenant.created'`); got != 1 {
		t.Fatalf("subject rows = %d", got)
	}
}

func TestProvisionPersonalDerivesUniqueSlugsAndRefusesTakenUsername(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	signup := func(username, org string) (string, error) {
		var slug string
		err := db.InTx(ctx, f.pool, func(tx pgx.Tx) error {
			id, err := f.svc.ProvisionPersonal(ctx, tx, username, "correct horse battery", "", org)
			if err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT t.slug FROM users u JOIN tenants t ON t.id = u.tenant_id WHERE u.id = $1 AND t.kind = 'personal'`, id).Scan(&slug)
		})
		return slug, err
	}
	first, err := signup("bob", "Bob's Lab!")
	if err != nil || first != "bob-s-lab" {
		t.Fatalf("first signup: slug %q, %v", first, err)
	}
	second, err := signup("carol", "Bob's Lab!")
	if err != nil || !strings.HasPrefix(second, "bob-s-lab-") || !tenancy.ValidSlug(second) {
		t.Fatalf("second signup: slug %q, %v", second, err)
	}
	if got := f.count(`SELECT count(*) FROM users WHERE username = 'carol' AND display_name = 'carol'`); got != 1 {
		t.Fatalf("display name defaults to the username: %d", got)
	}

	tenants := f.count(`SELECT count(*) FROM tenants`)
	_, err = signup("bob", "Another")
	e := wantCode(t, err, apierr.UserAlreadyExists, 409)
	wantDetail(t, e, "field", "username")
	if got := f.count(`SELECT count(*) FROM tenants`); got != tenants {
		t.Fatalf("tenants after refused signup = %d, want %d", got, tenants)
	}
	if got := f.audits("tenant.create"); got != 2 {
		t.Fatalf("tenant.create audits = %d, want 2", got)
	}
}

func TestSlugify(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"Acme Research", "acme-research"},
		{"  --Hello__World--  ", "hello-world"},
		{"Ünïcode Ørg", "n-code-rg"},
		{"!!!", "org"},
		{"X", "x-org"},
		{strings.Repeat("a", 100), strings.Repeat("a", 48)},
	} {
		got := tenancy.Slugify(c.in, "org")
		if got != c.want || !tenancy.ValidSlug(got) {
			t.Errorf("Slugify(%q) = %q, want %q (valid %v)", c.in, got, c.want, tenancy.ValidSlug(got))
		}
	}
}
