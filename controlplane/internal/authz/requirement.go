// Package authz declares, once per operation of the contract, who may call it, and
// enforces that declaration in the request chain after authentication and project
// context and before the request's parameters or body are read (docs/api.md,
// "Authorization"). The declarations live in one table, Operations (operations.go),
// keyed by the contract's operationId; a test checks the table against the embedded
// contract, so an operation cannot enter the contract without saying who may call it.
//
// Handlers keep the checks that depend on the object they load (ownership, the role in
// a project named in the body, the owner role of a member being changed); the
// role, tenant and platform part of every operation is decided here first, so a caller
// who may not call an operation learns nothing about its schema.
package authz

import (
	"context"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Kind is the class of caller an operation admits.
type Kind int

const (
	// KindUndeclared is the zero Requirement: an operation missing from the table. The
	// chain refuses it (fail closed) and the table test fails.
	KindUndeclared Kind = iota
	// KindPublic: anyone (health, sign-in, the contract document, a webhook or an
	// enrolment whose credential is in the body and checked by its handler).
	KindPublic
	// KindOwnCredential: the operation checks a credential of its own that the chain
	// does not know (the internal JWKS-refresh token, a WebSocket handshake's token, a
	// replica relay token); its handler or StrictMiddleware refuses before reading anything.
	KindOwnCredential
	// KindNode: an enrolled node (security nodeBearerAuth, checked by the chain).
	KindNode
	// KindAuthenticated: any authenticated user.
	KindAuthenticated
	// KindTenantMember: a user of a tenant (any tenant role).
	KindTenantMember
	// KindTenantAdmin: an admin of the caller's own tenant.
	KindTenantAdmin
	// KindProjectRole: at least Role in the request's project (header or path).
	KindProjectRole
	// KindCapability: a platform capability (seed §2.3, §5 rule 4), refused with Code.
	KindCapability
	// KindProjectRoleOrGrant: at least Role in the request's project, or a grant on the
	// storage bucket named in the path (projectctx.Project.Grant, which the chain sets
	// from the storage service for a caller whose role does not suffice): a viewer
	// requirement admits any grant, a stronger one only a read_write grant. A caller with
	// neither is told the bucket does not exist (by the chain, docs/storage.md "Access").
	KindProjectRoleOrGrant
)

// Requirement is what one operation demands of its caller.
type Requirement struct {
	Kind Kind
	// Role is the weakest project role admitted (KindProjectRole).
	Role string
	// Capability is the platform capability needed (KindCapability).
	Capability string
	// Code is the refusal of a KindCapability: admin_required on admin operations (seed
	// §5 rule 4), insufficient_permissions elsewhere.
	Code apierr.Code
	// Why says, for KindPublic and KindOwnCredential, what stands in for the check.
	Why string
	// StepUp: the caller must also hold a fresh second-factor proof (seed §5 rule 7;
	// principal.StepUp, set per request by the authenticator), else step_up_required.
	// Checked after the rest, so an under-privileged caller is told that first.
	StepUp bool
	// Machines admits machine identities (service accounts, project access credentials;
	// principal.Machine) to a KindAuthenticated operation. Machines are refused every
	// other operation but the KindProjectRole and KindProjectRoleOrGrant ones, where their
	// role is the one their token grants in that project (or a bucket grant names them):
	// they hold no tenant role and no platform capability.
	Machines bool
}

// ForMachines is r open to machine identities too (catalog reads, their own SSH keys).
func (r Requirement) ForMachines() Requirement {
	r.Machines = true
	return r
}

// WithStepUp is r for a sensitive operation: the caller must also have stepped up
// (POST /api/v1/auth/step-up) within the window. Only a human's verified TOTP code
// gives that proof, so a machine credential never satisfies it.
func (r Requirement) WithStepUp() Requirement {
	r.StepUp = true
	return r
}

// Public admits anyone; why names what protects the operation, if anything.
func Public(why string) Requirement { return Requirement{Kind: KindPublic, Why: why} }

// OwnCredential is an operation that authenticates a credential of its own (why names it).
func OwnCredential(why string) Requirement { return Requirement{Kind: KindOwnCredential, Why: why} }

// Node admits an enrolled node.
func Node() Requirement { return Requirement{Kind: KindNode} }

// Authenticated admits any signed-in user.
func Authenticated() Requirement { return Requirement{Kind: KindAuthenticated} }

// TenantMember admits users of a tenant.
func TenantMember() Requirement { return Requirement{Kind: KindTenantMember} }

// TenantAdmin admits the admins of the caller's tenant.
func TenantAdmin() Requirement { return Requirement{Kind: KindTenantAdmin} }

// ProjectRole admits callers with at least role in the request's project.
func ProjectRole(role string) Requirement { return Requirement{Kind: KindProjectRole, Role: role} }

// ProjectRoleOrGrant admits callers with at least role in the request's project, and
// holders of a storage grant on the bucket in the path that covers it (read for a viewer
// requirement, read_write for a stronger one).
func ProjectRoleOrGrant(role string) Requirement {
	return Requirement{Kind: KindProjectRoleOrGrant, Role: role}
}

// PlatformAdmin admits holders of platform.admin; others get admin_required.
func PlatformAdmin() Requirement { return AdminCapability(principal.CapAdmin) }

// AdminCapability is an admin operation open to a narrower capability than
// platform.admin (the audit log, fleet telemetry); others get admin_required.
func AdminCapability(c string) Requirement {
	return Requirement{Kind: KindCapability, Capability: c, Code: apierr.AdminRequired}
}

// Capability is a non-admin operation that needs platform capability c; others get
// insufficient_permissions.
func Capability(c string) Requirement {
	return Requirement{Kind: KindCapability, Capability: c, Code: apierr.InsufficientPermissions}
}

// Check decides whether the caller in ctx (principal and project context, as the chain
// set them) meets r. Kinds the chain authenticates by itself (public, own credential,
// node) pass: their credential has been checked, or is checked by the operation before
// it reads anything.
func (r Requirement) Check(ctx context.Context) error {
	if err := r.check(ctx); err != nil || !r.StepUp {
		return err
	}
	if p, ok := principal.From(ctx); !ok || !p.StepUp {
		return apierr.New(apierr.StepUpRequired, "this operation needs a fresh second factor: POST /api/v1/auth/step-up with a TOTP code and retry with that token")
	}
	return nil
}

func (r Requirement) check(ctx context.Context) error {
	switch r.Kind {
	case KindPublic, KindOwnCredential, KindNode:
		return nil
	case KindUndeclared:
		return apierr.New(apierr.InternalError, "this operation declares no access requirement")
	}
	p, ok := principal.From(ctx)
	if !ok {
		return apierr.New(apierr.TokenMissing, "authentication required")
	}
	if p.Machine != nil && r.Kind != KindProjectRole && r.Kind != KindProjectRoleOrGrant && !r.Machines {
		if r.Kind == KindCapability && r.Code == apierr.AdminRequired {
			return apierr.New(apierr.AdminRequired, "this operation needs a platform admin").With("reason", "machine_identity")
		}
		return apierr.Forbidden("a service account or access credential cannot call this operation").With("reason", "machine_identity")
	}
	switch r.Kind {
	case KindAuthenticated:
		return nil
	case KindTenantMember:
		if !inTenant(p) {
			return apierr.Forbidden("this operation needs a tenant member").With("reason", "no_tenant")
		}
		return nil
	case KindTenantAdmin:
		if !inTenant(p) {
			return apierr.Forbidden("this operation needs a tenant member").With("reason", "no_tenant")
		}
		if !p.IsTenantAdmin(p.TenantID) {
			return apierr.Forbidden("this operation needs a tenant admin").With("reason", "tenant_admin_required")
		}
		return nil
	case KindProjectRole:
		proj, ok := projectctx.From(ctx)
		if !ok { // a required header or path id always sets it; fail closed all the same
			return apierr.Forbidden("you do not have access to this project")
		}
		if !proj.AtLeast(r.Role) {
			return apierr.Forbidden("your project role does not allow this").
				With("role", proj.Role).With("required_role", r.Role)
		}
		return nil
	case KindProjectRoleOrGrant:
		proj, ok := projectctx.From(ctx)
		if !ok {
			return apierr.Forbidden("you do not have access to this project")
		}
		if proj.AtLeast(r.Role) || proj.GrantCovers(r.Role) {
			return nil
		}
		if proj.Grant != "" {
			return apierr.Forbidden("your grant on this bucket does not allow this").
				With("grant", proj.Grant).With("required_access", projectctx.GrantReadWrite)
		}
		return apierr.Forbidden("your project role does not allow this").
			With("role", proj.Role).With("required_role", r.Role)
	case KindCapability:
		if !p.Can(r.Capability) {
			if r.Code == apierr.AdminRequired {
				return apierr.New(apierr.AdminRequired, "this operation needs a platform admin").With("capability", r.Capability)
			}
			return apierr.Forbidden("this operation needs the %s capability", r.Capability).With("capability", r.Capability)
		}
		return nil
	}
	return apierr.New(apierr.InternalError, "unknown access requirement")
}

func inTenant(p *principal.Principal) bool { return p.TenantID != uuid.Nil }

// For is the requirement of operationId (the zero Requirement when undeclared).
func For(operationID string) Requirement { return Operations[operationID] }
