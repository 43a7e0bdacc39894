package tenancy_test

import (
	"context"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

func TestMembers(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	acme := f.org("Acme", "alice")
	other := f.org("Other", "oscar")
	owner := f.user(acme, "olga")
	adm := f.user(acme, "adam")
	mem := f.user(acme, "mia")
	p, err := f.svc.CreateProject(ctx, owner, tenancy.NewProject{Name: "P"})
	if err != nil {
		t.Fatal(err)
	}
	ownerCtx := f.access(owner, p.ID)

	if _, err := f.svc.AddMember(ctx, ownerCtx, adm.UserID, projectctx.RoleAdmin); err != nil {
		t.Fatal(err)
	}
	adminCtx := f.access(adm, p.ID)
	m, err := f.svc.AddMember(ctx, adminCtx, mem.UserID, projectctx.RoleMember)
	if err != nil || m.Username != "mia" || m.Role != projectctx.RoleMember {
		t.Fatalf("add = %+v, %v", m, err)
	}
	memberCtx := f.access(mem, p.ID)

	t.Run("refusals persist nothing", func(t *testing.T) {
		for _, c := range []struct {
			name   string
			do     func() error
			code   apierr.Code
			status int
		}{
			{"member cannot add", func() error {
				_, err := f.svc.AddMember(ctx, memberCtx, adminOf(acme).UserID, projectctx.RoleViewer)
				return err
			}, apierr.InsufficientPermissions, 403},
			{"admin cannot add an owner", func() error {
				_, err := f.svc.AddMember(ctx, adminCtx, adminOf(acme).UserID, projectctx.RoleOwner)
				return err
			}, apierr.InsufficientPermissions, 403},
			{"user of another tenant", func() error {
				_, err := f.svc.AddMember(ctx, ownerCtx, other.Admin.ID, projectctx.RoleViewer)
				return err
			}, apierr.UserNotFound, 404},
			{"already a member", func() error {
				_, err := f.svc.AddMember(ctx, ownerCtx, mem.UserID, projectctx.RoleViewer)
				return err
			}, apierr.UserAlreadyExists, 409},
			{"admin cannot demote the owner", func() error {
				_, err := f.svc.UpdateMember(ctx, adminCtx, owner.UserID, projectctx.RoleAdmin)
				return err
			}, apierr.InsufficientPermissions, 403},
			{"admin cannot promote to owner", func() error {
				_, err := f.svc.UpdateMember(ctx, adminCtx, mem.UserID, projectctx.RoleOwner)
				return err
			}, apierr.InsufficientPermissions, 403},
			{"admin cannot remove the owner", func() error {
				return f.svc.RemoveMember(ctx, adminCtx, owner.UserID)
			}, apierr.InsufficientPermissions, 403},
			{"last owner cannot be demoted", func() error {
				_, err := f.svc.UpdateMember(ctx, ownerCtx, owner.UserID, projectctx.RoleAdmin)
				return err
			}, apierr.InvalidRequest, 409},
			{"last owner cannot be removed", func() error {
				return f.svc.RemoveMember(ctx, ownerCtx, owner.UserID)
			}, apierr.InvalidRequest, 409},
			{"unknown member", func() error {
				return f.svc.RemoveMember(ctx, ownerCtx, other.Admin.ID)
			}, apierr.UserNotFound, 404},
		} {
			t.Run(c.name, func(t *testing.T) {
				before := f.count(`SELECT count(*) FROM audit_events`)
				rows := f.count(`SELECT count(*) FROM project_members WHERE project_id = $1`, p.ID)
				owners := f.count(`SELECT count(*) FROM project_members WHERE project_id = $1 AND role = 'owner'`, p.ID)
				wantCode(t, c.do(), c.code, c.status)
				if f.count(`SELECT count(*) FROM audit_events`) != before ||
					f.count(`SELECT count(*) FROM project_members WHERE project_id = $1`, p.ID) != rows ||
					f.count(`SELECT count(*) FROM project_members WHERE project_id = $1 AND role = 'owner'`, p.ID) != owners {
					t.Fatal("a refused change persisted something")
				}
			})
		}
	})

	t.Run("last owner reason", func(t *testing.T) {
		e := wantCode(t, f.svc.RemoveMember(ctx, ownerCtx, owner.UserID), apierr.InvalidRequest, 409)
		wantDetail(t, e, "reason", "last_owner")
	})

	t.Run("same role changes nothing", func(t *testing.T) {
		before := f.audits("project.member.update")
		if _, err := f.svc.UpdateMember(ctx, adminCtx, mem.UserID, projectctx.RoleMember); err != nil {
			t.Fatal(err)
		}
		if f.audits("project.member.update") != before {
			t.Fatal("no-op update was audited")
		}
	})

	t.Run("with a second owner the first may step down", func(t *testing.T) {
		if _, err := f.svc.UpdateMember(ctx, ownerCtx, adm.UserID, projectctx.RoleOwner); err != nil {
			t.Fatal(err)
		}
		if _, err := f.svc.UpdateMember(ctx, ownerCtx, owner.UserID, projectctx.RoleViewer); err != nil {
			t.Fatal(err)
		}
		if err := f.svc.RemoveMember(ctx, f.access(adm, p.ID), owner.UserID); err != nil {
			t.Fatal(err)
		}
		if n := f.count(`SELECT count(*) FROM project_members WHERE project_id = $1 AND role = 'owner'`, p.ID); n != 1 {
			t.Fatalf("owners = %d", n)
		}
		if f.audits("project.member.update") != 2 || f.audits("project.member.remove") != 1 || f.audits("project.member.add") != 2 {
			t.Fatalf("audits: update %d remove %d add %d", f.audits("project.member.update"), f.audits("project.member.remove"), f.audits("project.member.add"))
		}
	})

	t.Run("list pages by user id", func(t *testing.T) {
		pg, err := f.svc.ListMembers(ctx, memberCtx, [16]byte{}, 1)
		if err != nil || len(pg.Items) != 1 || !pg.More {
			t.Fatalf("page 1 = %+v, %v", pg, err)
		}
		pg2, err := f.svc.ListMembers(ctx, memberCtx, pg.Items[0].UserID, 10)
		if err != nil || len(pg2.Items) != 1 || pg2.More || pg2.Items[0].UserID == pg.Items[0].UserID {
			t.Fatalf("page 2 = %+v, %v", pg2, err)
		}
	})
}
