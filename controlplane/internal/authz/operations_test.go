package authz_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/authz"
	"github.com/gantry-gpu/gantry/controlplane/internal/contract"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// TestTableMatchesContract: every operation of the embedded contract has exactly one
// declaration, no declaration names an operation the contract lacks, and each
// declaration fits the operation's security scheme and project context (a project role
// needs a project the chain resolves; a user requirement needs the bearer scheme).
func TestTableMatchesContract(t *testing.T) {
	c := contract.MustLoad()
	seen := map[string]bool{}
	for _, op := range c.Ops() {
		if seen[op.ID] {
			t.Errorf("operationId %s appears twice in the contract", op.ID)
		}
		seen[op.ID] = true
		req, ok := authz.Operations[op.ID]
		if !ok {
			t.Errorf("%s %s (%s) has no entry in authz.Operations: declare who may call it", op.Method, op.Path, op.ID)
			continue
		}
		switch req.Kind {
		case authz.KindPublic:
			if op.Security != contract.SecurityNone {
				t.Errorf("%s is declared public but the contract secures it", op.ID)
			}
			if req.Why == "" {
				t.Errorf("%s is public without saying why", op.ID)
			}
		case authz.KindOwnCredential:
			if op.Security != contract.SecurityNone && op.Security != contract.SecurityInternalToken {
				t.Errorf("%s declares its own credential but the chain authenticates it", op.ID)
			}
			if req.Why == "" {
				t.Errorf("%s does not name its credential", op.ID)
			}
		case authz.KindNode:
			if op.Security != contract.SecurityNode {
				t.Errorf("%s is declared for nodes but is not nodeBearerAuth", op.ID)
			}
		case authz.KindAuthenticated, authz.KindTenantMember, authz.KindTenantAdmin, authz.KindProjectRole, authz.KindProjectRoleOrGrant, authz.KindCapability:
			if op.Security != contract.SecurityBearer {
				t.Errorf("%s needs a user but the contract does not declare bearerAuth", op.ID)
			}
		default:
			t.Errorf("%s has an undeclared requirement", op.ID)
		}
		if req.StepUp && req.Kind < authz.KindAuthenticated {
			t.Errorf("%s asks for step-up but admits callers who are not users", op.ID)
		}
		switch req.Kind {
		case authz.KindProjectRoleOrGrant:
			if !op.HeaderRequired || !strings.Contains(op.Path, "{bucket_id}") {
				t.Errorf("%s admits a bucket grant but names no owner project and bucket", op.ID)
			}
			if req.Role != projectctx.RoleViewer && req.Role != projectctx.RoleMember {
				t.Errorf("%s admits a grant in place of project role %q", op.ID, req.Role)
			}
		case authz.KindProjectRole:
			if !op.ProjectPath && !op.HeaderRequired {
				t.Errorf("%s needs a project role but has no required project context", op.ID)
			}
			if !slices.Contains([]string{projectctx.RoleViewer, projectctx.RoleMember, projectctx.RoleAdmin, projectctx.RoleOwner}, req.Role) {
				t.Errorf("%s names project role %q", op.ID, req.Role)
			}
		case authz.KindCapability:
			if !slices.Contains(principal.CapabilitiesFor([]string{principal.RoleSuperadmin}), req.Capability) {
				t.Errorf("%s names capability %q", op.ID, req.Capability)
			}
			if req.Code != apierr.AdminRequired && req.Code != apierr.InsufficientPermissions {
				t.Errorf("%s refuses with %q", op.ID, req.Code)
			}
		}
	}
	for id := range authz.Operations {
		if !seen[id] {
			t.Errorf("authz.Operations declares %s, which is not an operation of the contract", id)
		}
	}
}

// TestCheck: each requirement admits exactly the callers it names and refuses the others
// with the contract's code.
func TestCheck(t *testing.T) {
	tenant := uuid.New()
	anon := context.Background()
	user := func(tenantID uuid.UUID, tenantRole string, roles ...string) context.Context {
		return principal.With(anon, &principal.Principal{UserID: uuid.New(), TenantID: tenantID, TenantRole: tenantRole,
			PlatformRole: roles, Capabilities: principal.CapabilitiesFor(roles)})
	}
	loner := user(uuid.Nil, "")
	tmember := user(tenant, principal.TenantRoleMember)
	tadmin := user(tenant, principal.TenantRoleAdmin)
	super := user(uuid.Nil, "", principal.RoleSuperadmin)
	ops := user(uuid.Nil, "", principal.RoleOps)
	steppedUp := principal.With(anon, &principal.Principal{UserID: uuid.New(), StepUp: true,
		PlatformRole: []string{principal.RoleSuperadmin}, Capabilities: principal.CapabilitiesFor([]string{principal.RoleSuperadmin})})
	in := func(ctx context.Context, role string) context.Context {
		return projectctx.With(ctx, projectctx.Project{ID: uuid.New(), TenantID: tenant, Role: role})
	}
	// A grantee of a bucket who is not a member of its project.
	granted := func(ctx context.Context, grant string) context.Context {
		return projectctx.With(ctx, projectctx.Project{ID: uuid.New(), TenantID: tenant, Grant: grant})
	}
	cases := []struct {
		name string
		req  authz.Requirement
		ctx  context.Context
		want apierr.Code // "" admits
	}{
		{"undeclared fails closed", authz.Requirement{}, super, apierr.InternalError},
		{"public", authz.Public("x"), anon, ""},
		{"node", authz.Node(), anon, ""},
		{"authenticated, anonymous", authz.Authenticated(), anon, apierr.TokenMissing},
		{"authenticated", authz.Authenticated(), loner, ""},
		{"tenant member, none", authz.TenantMember(), loner, apierr.InsufficientPermissions},
		{"tenant member", authz.TenantMember(), tmember, ""},
		{"tenant admin, member", authz.TenantAdmin(), tmember, apierr.InsufficientPermissions},
		{"tenant admin, none", authz.TenantAdmin(), super, apierr.InsufficientPermissions},
		{"tenant admin", authz.TenantAdmin(), tadmin, ""},
		{"project member, viewer", authz.ProjectRole(projectctx.RoleMember), in(tmember, projectctx.RoleViewer), apierr.InsufficientPermissions},
		{"project member, member", authz.ProjectRole(projectctx.RoleMember), in(tmember, projectctx.RoleMember), ""},
		{"project owner, admin", authz.ProjectRole(projectctx.RoleOwner), in(tadmin, projectctx.RoleAdmin), apierr.InsufficientPermissions},
		{"project role, no context", authz.ProjectRole(projectctx.RoleViewer), tmember, apierr.InsufficientPermissions},
		{"member or grant, viewer", authz.ProjectRoleOrGrant(projectctx.RoleMember), in(tmember, projectctx.RoleViewer), apierr.InsufficientPermissions},
		{"member or grant, read grant", authz.ProjectRoleOrGrant(projectctx.RoleMember), granted(tmember, projectctx.GrantRead), apierr.InsufficientPermissions},
		{"member or grant, read_write grant", authz.ProjectRoleOrGrant(projectctx.RoleMember), granted(tmember, projectctx.GrantReadWrite), ""},
		{"viewer or grant, read grant", authz.ProjectRoleOrGrant(projectctx.RoleViewer), granted(tmember, projectctx.GrantRead), ""},
		{"viewer or grant, viewer", authz.ProjectRoleOrGrant(projectctx.RoleViewer), in(tmember, projectctx.RoleViewer), ""},
		{"viewer or grant, nothing", authz.ProjectRoleOrGrant(projectctx.RoleViewer), in(tmember, ""), apierr.InsufficientPermissions},
		{"viewer or grant, no context", authz.ProjectRoleOrGrant(projectctx.RoleViewer), tmember, apierr.InsufficientPermissions},
		{"platform admin, tenant admin", authz.PlatformAdmin(), tadmin, apierr.AdminRequired},
		{"platform admin, ops", authz.PlatformAdmin(), ops, apierr.AdminRequired},
		{"platform admin", authz.PlatformAdmin(), super, ""},
		{"audit read, ops", authz.AdminCapability(principal.CapAuditRead), ops, ""},
		{"audit read, tenant admin", authz.AdminCapability(principal.CapAuditRead), tadmin, apierr.AdminRequired},
		{"node read, tenant admin", authz.Capability(principal.CapNodeRead), tadmin, apierr.InsufficientPermissions},
		{"node read, ops", authz.Capability(principal.CapNodeRead), ops, ""},
		{"step-up, not stepped up", authz.PlatformAdmin().WithStepUp(), super, apierr.StepUpRequired},
		{"step-up, role first", authz.PlatformAdmin().WithStepUp(), tadmin, apierr.AdminRequired},
		{"step-up, anonymous", authz.Authenticated().WithStepUp(), anon, apierr.TokenMissing},
		{"step-up", authz.PlatformAdmin().WithStepUp(), steppedUp, ""},
	}
	for _, c := range cases {
		err := c.req.Check(c.ctx)
		if got := apierr.CodeOf(err); (err == nil) != (c.want == "") || (err != nil && got != c.want) {
			t.Errorf("%s: got %v (%s), want %q", c.name, err, got, c.want)
		}
	}
}
