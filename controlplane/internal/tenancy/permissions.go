package tenancy

import (
	"slices"

	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Action is something a caller does inside a project.
type Action string

// Project actions.
const (
	ActRead            Action = "project.read"           // see the project, its members and its objects
	ActCreateWorkloads Action = "workload.create"        // allocations, app instances, buckets, ...
	ActUpdateProject   Action = "project.update"         // rename, change slug
	ActManageMembers   Action = "project.members.manage" // add, change and remove non-owner members
	ActManageOwners    Action = "project.owners.manage"  // grant, change or remove the owner role
	ActDeleteProject   Action = "project.delete"         // delete the project
)

// Actions lists every project action, weakest first.
var Actions = []Action{ActRead, ActCreateWorkloads, ActUpdateProject, ActManageMembers, ActManageOwners, ActDeleteProject}

// Permissions is the one table of what each project role may do (seed §5 rule 5).
var Permissions = map[string][]Action{
	projectctx.RoleViewer: {ActRead},
	projectctx.RoleMember: {ActRead, ActCreateWorkloads},
	projectctx.RoleAdmin:  {ActRead, ActCreateWorkloads, ActUpdateProject, ActManageMembers},
	projectctx.RoleOwner:  {ActRead, ActCreateWorkloads, ActUpdateProject, ActManageMembers, ActManageOwners, ActDeleteProject},
}

// Can reports whether role may perform a.
func Can(role string, a Action) bool { return slices.Contains(Permissions[role], a) }

// Require refuses a with insufficient_permissions unless the caller's role in pc allows it.
func Require(pc projectctx.Project, a Action) error {
	if Can(pc.Role, a) {
		return nil
	}
	return apierr.Forbidden("your project role does not allow this").With("action", string(a)).With("role", pc.Role)
}

// CanChangeMember reports whether a caller with role actor may move a member from role
// from to role to. from is "" when the member is added, to is "" when removed. Any move
// that touches the owner role needs ActManageOwners; the rest needs ActManageMembers.
func CanChangeMember(actor, from, to string) bool {
	if !Can(actor, ActManageMembers) {
		return false
	}
	if from == projectctx.RoleOwner || to == projectctx.RoleOwner {
		return Can(actor, ActManageOwners)
	}
	return true
}

// requireMemberChange is CanChangeMember as an error.
func requireMemberChange(pc projectctx.Project, from, to string) error {
	if CanChangeMember(pc.Role, from, to) {
		return nil
	}
	a := ActManageMembers
	if from == projectctx.RoleOwner || to == projectctx.RoleOwner {
		a = ActManageOwners
	}
	return apierr.Forbidden("your project role does not allow this").With("action", string(a)).With("role", pc.Role)
}
