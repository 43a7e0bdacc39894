package tenancy_test

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

func TestAccess(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	acme := f.org("Acme", "alice")
	other := f.org("Other", "oscar")
	admin := adminOf(acme)
	viewer := f.user(acme, "vera")
	outsider := f.user(acme, "nina")
	// A project the tenant admin is not a member of.
	proj, err := f.svc.CreateProject(ctx, viewer, tenancy.NewProject{Name: "Vera's"})
	if err != nil {
		t.Fatal(err)
	}
	// A former member has no access either.
	if _, err := f.svc.AddMember(ctx, f.access(viewer, proj.ID), outsider.UserID, projectctx.RoleViewer); err != nil {
		t.Fatal(err)
	}
	if err := f.svc.RemoveMember(ctx, f.access(viewer, proj.ID), outsider.UserID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.AddMember(ctx, f.access(admin, acme.Project.ID), viewer.UserID, projectctx.RoleViewer); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name    string
		p       *principal.Principal
		project uuid.UUID
		role    string // "" means refused
	}{
		{"owner", viewer, proj.ID, projectctx.RoleOwner},
		{"viewer member", viewer, acme.Project.ID, projectctx.RoleViewer},
		{"non-member", outsider, proj.ID, ""},
		{"non-member of default project", outsider, acme.Project.ID, ""},
		{"tenant admin without membership", admin, proj.ID, projectctx.RoleAdmin},
		{"tenant admin who owns the project", admin, acme.Project.ID, projectctx.RoleOwner},
		{"other tenant's admin", adminOf(other), proj.ID, ""},
		{"other tenant's user on own tenant id forged", &principal.Principal{UserID: viewer.UserID, TenantID: other.Tenant.ID, TenantRole: principal.TenantRoleAdmin}, proj.ID, ""},
		{"unknown project", admin, uuid.Must(uuid.NewV7()), ""},
		{"caller outside any tenant", &principal.Principal{UserID: uuid.Must(uuid.NewV7())}, proj.ID, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			pc, err := f.svc.Access(ctx, c.p, c.project)
			if c.role == "" {
				e := wantCode(t, err, apierr.InsufficientPermissions, 403)
				if e.Message != "you do not have access to this project" {
					t.Fatalf("message reveals too much: %q", e.Message)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if pc.Role != c.role || pc.ID != c.project || pc.TenantID != acme.Tenant.ID {
				t.Fatalf("got %+v, want role %s", pc, c.role)
			}
		})
	}
	if pc := f.access(admin, acme.Project.ID); !pc.IsDefault || pc.Department != acme.Department.ID {
		t.Fatalf("default project context = %+v", pc)
	}
}
