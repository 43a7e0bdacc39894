package tenancy_test

import (
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

var roles = []string{projectctx.RoleViewer, projectctx.RoleMember, projectctx.RoleAdmin, projectctx.RoleOwner}

// TestPermissionsTable walks every role against every action, the allowed and the
// forbidden moves alike.
func TestPermissionsTable(t *testing.T) {
	allowed := map[string]map[tenancy.Action]bool{
		projectctx.RoleViewer: {tenancy.ActRead: true},
		projectctx.RoleMember: {tenancy.ActRead: true, tenancy.ActCreateWorkloads: true},
		projectctx.RoleAdmin: {tenancy.ActRead: true, tenancy.ActCreateWorkloads: true, tenancy.ActUpdateProject: true,
			tenancy.ActManageMembers: true},
		projectctx.RoleOwner: {tenancy.ActRead: true, tenancy.ActCreateWorkloads: true, tenancy.ActUpdateProject: true,
			tenancy.ActManageMembers: true, tenancy.ActManageOwners: true, tenancy.ActDeleteProject: true},
		"":         {},
		"intruder": {},
	}
	for role, want := range allowed {
		for _, a := range tenancy.Actions {
			got := tenancy.Can(role, a)
			if got != want[a] {
				t.Errorf("Can(%q, %s) = %v, want %v", role, a, got, want[a])
			}
			err := tenancy.Require(projectctx.Project{Role: role}, a)
			if want[a] && err != nil {
				t.Errorf("Require(%q, %s) = %v", role, a, err)
			}
			if !want[a] {
				e := wantCode(t, err, apierr.InsufficientPermissions, 403)
				wantDetail(t, e, "action", string(a))
			}
		}
	}
	if len(tenancy.Permissions) != len(roles) {
		t.Fatalf("table has %d roles, want %d", len(tenancy.Permissions), len(roles))
	}
}

// TestMemberMoves walks every (actor, from, to) membership move.
func TestMemberMoves(t *testing.T) {
	withNone := append([]string{""}, roles...)
	for _, actor := range roles {
		for _, from := range withNone {
			for _, to := range withNone {
				if from == "" && to == "" {
					continue
				}
				var want bool
				switch actor {
				case projectctx.RoleOwner:
					want = true
				case projectctx.RoleAdmin:
					want = from != projectctx.RoleOwner && to != projectctx.RoleOwner
				}
				if got := tenancy.CanChangeMember(actor, from, to); got != want {
					t.Errorf("CanChangeMember(%s, %q -> %q) = %v, want %v", actor, from, to, got, want)
				}
			}
		}
	}
}
