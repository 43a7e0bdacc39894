package tenancy_test

import (
	"context"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

func ptr[T any](v T) *T { return &v }

func TestCreateProject(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	acme := f.org("Acme", "alice")
	other := f.org("Other", "oscar")
	bob := f.user(acme, "bob")

	t.Run("default department, derived slug, caller owns it", func(t *testing.T) {
		p, err := f.svc.CreateProject(ctx, bob, tenancy.NewProject{Name: "Vision Models"})
		if err != nil {
			t.Fatal(err)
		}
		if p.Slug != "vision-models" || p.DepartmentID != acme.Department.ID || p.Role != projectctx.RoleOwner || p.IsDefault {
			t.Fatalf("project = %+v", p)
		}
		if n := f.count(`SELECT count(*) FROM audit_events WHERE action = 'project.create' AND target_id = $1`, p.ID.String()); n != 1 {
			t.Fatalf("audit rows = %d", n)
		}
		if n := f.count(`SELECT count(*) FROM outbox_events WHERE event_type = 'project.created' AND payload->>'project_id' = $1`, p.ID.String()); n != 1 {
			t.Fatalf("events = %d", n)
		}
	})
	t.Run("derived slug collision is suffixed", func(t *testing.T) {
		p, err := f.svc.CreateProject(ctx, bob, tenancy.NewProject{Name: "Vision models"})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(p.Slug, "vision-models-") || !tenancy.ValidSlug(p.Slug) {
			t.Fatalf("slug = %q", p.Slug)
		}
	})
	t.Run("named department of the tenant", func(t *testing.T) {
		d, err := f.svc.CreateDepartment(ctx, adminOf(acme), "Research", "research")
		if err != nil {
			t.Fatal(err)
		}
		p, err := f.svc.CreateProject(ctx, bob, tenancy.NewProject{Name: "R1", Slug: "r1", DepartmentID: d.ID})
		if err != nil || p.DepartmentID != d.ID || p.DepartmentName != "Research" || p.Slug != "r1" {
			t.Fatalf("project = %+v, %v", p, err)
		}
	})

	refusals := []struct {
		name   string
		in     tenancy.NewProject
		code   apierr.Code
		status int
		field  string
		reason string
	}{
		{"another tenant's department", tenancy.NewProject{Name: "X", DepartmentID: other.Department.ID}, apierr.InvalidRequest, 404, "department_id", "not_found"},
		{"taken explicit slug", tenancy.NewProject{Name: "X", Slug: "vision-models"}, apierr.InvalidRequest, 409, "slug", "slug_taken"},
		{"default slug is taken", tenancy.NewProject{Name: "X", Slug: "default"}, apierr.InvalidRequest, 409, "slug", "slug_taken"},
	}
	for _, c := range refusals {
		t.Run(c.name, func(t *testing.T) {
			projects, audits, members := f.count(`SELECT count(*) FROM projects`), f.audits("project.create"), f.count(`SELECT count(*) FROM project_members`)
			_, err := f.svc.CreateProject(ctx, bob, c.in)
			e := wantCode(t, err, c.code, c.status)
			wantDetail(t, e, "field", c.field)
			wantDetail(t, e, "reason", c.reason)
			if f.count(`SELECT count(*) FROM projects`) != projects || f.audits("project.create") != audits ||
				f.count(`SELECT count(*) FROM project_members`) != members {
				t.Fatal("a refused create persisted something")
			}
		})
	}
	t.Run("disabled department", func(t *testing.T) {
		d, err := f.svc.CreateDepartment(ctx, adminOf(acme), "Old", "old")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.svc.UpdateDepartment(ctx, adminOf(acme), d.ID, tenancy.DepartmentPatch{LifecycleState: ptr(tenancy.DepartmentDisabled)}); err != nil {
			t.Fatal(err)
		}
		_, err = f.svc.CreateProject(ctx, bob, tenancy.NewProject{Name: "X", DepartmentID: d.ID})
		e := wantCode(t, err, apierr.ValidationError, 422)
		wantDetail(t, e, "reason", "department_disabled")
	})
	t.Run("caller outside a tenant", func(t *testing.T) {
		_, err := f.svc.CreateProject(ctx, &principalOutside, tenancy.NewProject{Name: "X"})
		wantCode(t, err, apierr.InsufficientPermissions, 403)
	})
}

func TestUpdateProject(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	acme := f.org("Acme", "alice")
	owner := adminOf(acme)
	p, err := f.svc.CreateProject(ctx, owner, tenancy.NewProject{Name: "P", Slug: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	base := f.access(owner, p.ID)
	for _, role := range []string{projectctx.RoleViewer, projectctx.RoleMember} {
		pc := base
		pc.Role = role
		_, err := f.svc.UpdateProject(ctx, pc, owner.UserID, tenancy.ProjectPatch{Name: ptr("New")})
		wantCode(t, err, apierr.InsufficientPermissions, 403)
	}
	admin := base
	admin.Role = projectctx.RoleAdmin
	got, err := f.svc.UpdateProject(ctx, admin, owner.UserID, tenancy.ProjectPatch{Name: ptr("Renamed"), Slug: ptr("renamed")})
	if err != nil || got.Name != "Renamed" || got.Slug != "renamed" || got.Role != projectctx.RoleAdmin {
		t.Fatalf("update = %+v, %v", got, err)
	}
	if n := f.audits("project.update"); n != 1 {
		t.Fatalf("audits = %d, want 1", n)
	}
	// The same values again change nothing: no audit row.
	if _, err := f.svc.UpdateProject(ctx, admin, owner.UserID, tenancy.ProjectPatch{Name: ptr("Renamed"), Slug: ptr("renamed")}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.UpdateProject(ctx, admin, owner.UserID, tenancy.ProjectPatch{}); err != nil {
		t.Fatal(err)
	}
	if n := f.audits("project.update"); n != 1 {
		t.Fatalf("audits after no-op updates = %d, want 1", n)
	}
	_, err = f.svc.UpdateProject(ctx, admin, owner.UserID, tenancy.ProjectPatch{Slug: ptr("default")})
	e := wantCode(t, err, apierr.InvalidRequest, 409)
	wantDetail(t, e, "reason", "slug_taken")
	if n := f.count(`SELECT count(*) FROM projects WHERE id = $1 AND slug = 'renamed'`, p.ID); n != 1 {
		t.Fatal("refused update changed the slug")
	}
}

func TestDeleteProject(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	acme := f.org("Acme", "alice")
	owner := adminOf(acme)
	bob := f.user(acme, "bob")
	live := false
	f.svc.ProjectInUse = func(context.Context, pgxTx, uuidT) (bool, error) { return live, nil }

	// The default project stays, whoever asks.
	e := wantCode(t, f.svc.DeleteProject(ctx, f.access(owner, acme.Project.ID)), apierr.InvalidRequest, 409)
	wantDetail(t, e, "reason", "default_project")

	p, err := f.svc.CreateProject(ctx, bob, tenancy.NewProject{Name: "Doomed", Slug: "doomed"})
	if err != nil {
		t.Fatal(err)
	}
	// The tenant admin is an admin there, not an owner.
	wantCode(t, f.svc.DeleteProject(ctx, f.access(owner, p.ID)), apierr.InsufficientPermissions, 403)

	// Live workloads: refused, nothing written.
	live = true
	e = wantCode(t, f.svc.DeleteProject(ctx, f.access(bob, p.ID)), apierr.InvalidRequest, 409)
	wantDetail(t, e, "reason", "project_in_use")
	if f.count(`SELECT count(*) FROM projects WHERE id = $1 AND deleted_at IS NULL`, p.ID) != 1 || f.audits("project.delete") != 0 {
		t.Fatal("a refused deletion wrote")
	}
	live = false

	stale := f.access(bob, p.ID) // a request whose project check ran before the deletion
	if err := f.svc.DeleteProject(ctx, f.access(bob, p.ID)); err != nil {
		t.Fatal(err)
	}
	// Soft: the row and the memberships stay (history refers to them), marked deleted.
	if f.count(`SELECT count(*) FROM projects WHERE id = $1 AND deleted_at = $2`, p.ID, t0) != 1 ||
		f.count(`SELECT count(*) FROM project_members WHERE project_id = $1`, p.ID) != 1 {
		t.Fatal("the project row or its memberships are gone, or not marked deleted")
	}
	if f.audits("project.delete") != 1 || f.events(tenancy.EventProjectDeleted) != 1 {
		t.Fatalf("audit %d, events %d", f.audits("project.delete"), f.events(tenancy.EventProjectDeleted))
	}
	// Gone for every reader: access, lists, and a request that checked access before.
	_, err = f.svc.Access(ctx, bob, p.ID)
	wantCode(t, err, apierr.InsufficientPermissions, 403)
	for _, who := range []*principal.Principal{bob, owner} {
		got, err := f.svc.ListProjects(ctx, who)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range got {
			if g.ID == p.ID {
				t.Fatalf("%s still lists the deleted project", who.Username)
			}
		}
	}
	wantCode(t, f.svc.DeleteProject(ctx, stale), apierr.InsufficientPermissions, 403)
	name := "Renamed"
	_, err = f.svc.UpdateProject(ctx, stale, bob.UserID, tenancy.ProjectPatch{Name: &name})
	wantCode(t, err, apierr.InsufficientPermissions, 403)
	_, err = f.svc.AddMember(ctx, stale, owner.UserID, projectctx.RoleMember)
	wantCode(t, err, apierr.InsufficientPermissions, 403)
	if f.audits("project.delete") != 1 || f.audits("project.update") != 0 {
		t.Fatal("a stale request wrote to a deleted project")
	}

	// The slug is free again: for a new project, and for a rename.
	again, err := f.svc.CreateProject(ctx, bob, tenancy.NewProject{Name: "Doomed again", Slug: "doomed"})
	if err != nil || again.Slug != "doomed" {
		t.Fatalf("reuse the slug: %+v %v", again, err)
	}
	other, err := f.svc.CreateProject(ctx, bob, tenancy.NewProject{Name: "Other", Slug: "other"})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.svc.DeleteProject(ctx, f.access(bob, again.ID)); err != nil {
		t.Fatal(err)
	}
	slug := "doomed"
	if up, err := f.svc.UpdateProject(ctx, f.access(bob, other.ID), bob.UserID, tenancy.ProjectPatch{Slug: &slug}); err != nil || up.Slug != slug {
		t.Fatalf("rename to a deleted project's slug: %+v %v", up, err)
	}
}

// Without a ProjectInUse check a deletion cannot know whether workloads would be
// stranded: it refuses rather than guess.
func TestDeleteProjectNeedsTheInUseCheck(t *testing.T) {
	f := newFixture(t)
	acme := f.org("Acme", "alice")
	bob := f.user(acme, "bob")
	p, err := f.svc.CreateProject(context.Background(), bob, tenancy.NewProject{Name: "Kept"})
	if err != nil {
		t.Fatal(err)
	}
	f.svc.ProjectInUse = nil
	if err := f.svc.DeleteProject(context.Background(), f.access(bob, p.ID)); err == nil {
		t.Fatal("deleted without knowing whether workloads run")
	}
	if f.count(`SELECT count(*) FROM projects WHERE id = $1 AND deleted_at IS NULL`, p.ID) != 1 {
		t.Fatal("the project was deleted")
	}
}

func TestListProjects(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	acme := f.org("Acme", "alice")
	f.org("Other", "oscar")
	bob := f.user(acme, "bob")
	bp, err := f.svc.CreateProject(ctx, bob, tenancy.NewProject{Name: "Bob's"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := f.svc.ListProjects(ctx, bob)
	if err != nil || len(got) != 1 || got[0].ID != bp.ID || got[0].Role != projectctx.RoleOwner {
		t.Fatalf("bob sees %+v, %v", got, err)
	}
	got, err = f.svc.ListProjects(ctx, adminOf(acme))
	if err != nil || len(got) != 2 {
		t.Fatalf("admin sees %+v, %v", got, err)
	}
	roles := map[string]string{}
	for _, p := range got {
		roles[p.Slug] = p.Role
	}
	if roles["default"] != projectctx.RoleOwner || roles[bp.Slug] != projectctx.RoleAdmin {
		t.Fatalf("admin roles = %v", roles)
	}
	got, err = f.svc.ListProjects(ctx, &principalOutside)
	if err != nil || len(got) != 0 {
		t.Fatalf("outsider sees %+v, %v", got, err)
	}
}
