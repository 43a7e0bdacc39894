// Package principal describes who is calling: set once by authentication, read by every
// handler. It owns the capability rules of seed §5 (platform roles -> capabilities) and
// nothing else.
package principal

import (
	"context"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Platform roles (seed §2.3).
const (
	RoleSuperadmin = "platform_superadmin"
	RoleOps        = "platform_ops"
	RoleUser       = "platform_user"
)

// Capabilities (seed §2.3).
const (
	CapAdmin           = "platform.admin"
	CapOpsRead         = "platform.ops.read"
	CapOpsWrite        = "platform.ops.write"
	CapOpsRunbookRead  = "platform.ops.runbook.read"
	CapNodeRead        = "platform.node.read"
	CapAuditRead       = "platform.audit.read"
	TenantRoleAdmin    = "admin"
	TenantRoleMember   = "member"
	RoleSourceUsers    = "users_role"
	RoleSourceBindings = "bindings"
)

// capabilitiesOf is the one table from platform role to capabilities.
var capabilitiesOf = map[string][]string{
	RoleSuperadmin: {CapAdmin, CapOpsRead, CapOpsWrite, CapOpsRunbookRead, CapNodeRead, CapAuditRead},
	RoleOps:        {CapOpsRead, CapOpsWrite, CapOpsRunbookRead, CapNodeRead, CapAuditRead},
	RoleUser:       {},
}

// CapabilitiesFor returns the sorted union of the capabilities of roles.
func CapabilitiesFor(roles []string) []string {
	var caps []string
	for _, r := range roles {
		for _, c := range capabilitiesOf[r] {
			if !slices.Contains(caps, c) {
				caps = append(caps, c)
			}
		}
	}
	slices.Sort(caps)
	if caps == nil {
		caps = []string{}
	}
	return caps
}

// Principal is an authenticated caller.
type Principal struct {
	UserID   uuid.UUID
	Username string
	// TenantID is uuid.Nil for a platform user outside any tenant.
	TenantID     uuid.UUID
	TenantRole   string
	PlatformRole []string
	RoleSource   string
	Capabilities []string
	// StepUp is true when the access token carries a fresh MFA proof: the authenticator
	// sets it on every request from AMR and AuthTime (auth.RequireStepUp reads it).
	StepUp bool
	// AMR are the token's authentication methods ("pwd", "otp"); AuthTime is when the
	// second factor was verified. Both are empty unless a TOTP code was verified
	// (POST /api/v1/auth/step-up); nothing else sets them.
	AMR      []string
	AuthTime time.Time
	// Machine is set when the caller is a machine identity (a service account or a
	// project access credential, signed in with the client-credentials grant); nil for
	// a person. UserID is then the identity's own users row (it owns what it creates),
	// and its only rights are its project roles: it holds no tenant role, no platform
	// capability and can never step up (seed §5 rule 7).
	Machine *Machine
}

// Machine kinds.
const (
	MachineServiceAccount    = "service_account"
	MachineProjectCredential = "project"
)

// Machine is what a machine identity's access token says about it.
type Machine struct {
	Kind             string
	ServiceAccountID uuid.UUID // uuid.Nil for a project access credential
	CredentialID     uuid.UUID
	// Projects maps each project the identity may act in to its role there; the role is
	// never owner.
	Projects map[uuid.UUID]string
}

// IsMachine reports whether the caller is a machine identity.
func (p *Principal) IsMachine() bool { return p.Machine != nil }

// Can reports whether the principal holds capability c.
func (p *Principal) Can(c string) bool { return slices.Contains(p.Capabilities, c) }

// IsPlatformAdmin reports whether admin operations are open to the principal.
func (p *Principal) IsPlatformAdmin() bool { return p.Can(CapAdmin) }

// IsTenantAdmin reports whether the principal administers tenant t.
func (p *Principal) IsTenantAdmin(t uuid.UUID) bool {
	return p.TenantID != uuid.Nil && p.TenantID == t && p.TenantRole == TenantRoleAdmin
}

// Key identifies the principal for per-caller state (idempotency scope, rate limits).
func (p *Principal) Key() string { return "user:" + p.UserID.String() }

type key struct{}

// With returns ctx carrying p.
func With(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, key{}, p)
}

// From is the principal of ctx.
func From(ctx context.Context) (*Principal, bool) {
	p, ok := ctx.Value(key{}).(*Principal)
	return p, ok && p != nil
}

// Node is an enrolled node authenticated by its node bearer token (node-facing
// operations, security nodeBearerAuth). It is never a Principal: a node holds no user
// capabilities.
type Node struct {
	ID uuid.UUID
	// Token is the bearer token the node presented (rotation re-verifies it under lock).
	Token string
}

type nodeKey struct{}

// WithNode returns ctx carrying the authenticated node.
func WithNode(ctx context.Context, n *Node) context.Context {
	return context.WithValue(ctx, nodeKey{}, n)
}

// NodeFrom is the authenticated node of ctx.
func NodeFrom(ctx context.Context) (*Node, bool) {
	n, ok := ctx.Value(nodeKey{}).(*Node)
	return n, ok && n != nil
}

// PlatformAdmin is the calling user when it holds platform.admin: admin operations
// refuse everyone else with admin_required (seed §5 rule 4), and an unauthenticated
// context (which the chain never lets through) with token_missing.
func PlatformAdmin(ctx context.Context) (*Principal, error) {
	p, ok := From(ctx)
	if !ok {
		return nil, apierr.New(apierr.TokenMissing, "authentication required")
	}
	if !p.IsPlatformAdmin() {
		return nil, apierr.New(apierr.AdminRequired, "this operation needs a platform admin")
	}
	return p, nil
}

// Required is the request's authenticated principal, or token_missing when the chain put
// none there (a handler reached without authentication is a wiring mistake, answered as
// an unauthenticated request rather than a panic).
func Required(ctx context.Context) (*Principal, error) {
	p, ok := From(ctx)
	if !ok {
		return nil, apierr.New(apierr.TokenMissing, "authentication required")
	}
	return p, nil
}
