// Package projectctx carries the project a request acts in and the caller's role there.
// The project-context middleware sets it (from X-Project-ID or the {project_id} path
// parameter, after checking membership); project-scoped handlers read it and must filter
// every query by Project.ID, so an object of another project is simply not found.
package projectctx

import (
	"context"
	"slices"
	"time"

	"github.com/google/uuid"
)

// Project roles, strongest first (seed §5 rule 5).
const (
	RoleOwner  = "owner"
	RoleAdmin  = "admin"
	RoleMember = "member"
	RoleViewer = "viewer"
)

var rank = []string{RoleViewer, RoleMember, RoleAdmin, RoleOwner}

// Project is the request's project context: the project row as loaded once by the
// project-context middleware, and the caller's role there. Handlers read it instead of
// loading the project again.
type Project struct {
	ID         uuid.UUID
	TenantID   uuid.UUID
	Role       string
	IsDefault  bool
	Department uuid.UUID

	Name           string
	Slug           string
	TenantName     string
	DepartmentName string
	DepartmentSlug string
	CreatedAt      time.Time
	UpdatedAt      time.Time

	// Grant is the caller's storage grant on the bucket an operation names
	// (GrantRead or GrantReadWrite; "" none). Only the storage operations declared
	// authz.ProjectRoleOrGrant set it, for a caller whose role does not cover them; Role
	// is then the caller's role ("" for a caller who is not a member at all).
	Grant string
}

// Storage grant access levels (docs/storage.md).
const (
	GrantRead      = "read"
	GrantReadWrite = "read_write"
)

// GrantCovers reports whether the caller's storage grant admits what role would:
// read for viewer, read_write for anything stronger.
func (p Project) GrantCovers(role string) bool {
	switch p.Grant {
	case GrantReadWrite:
		return true
	case GrantRead:
		return role == RoleViewer
	}
	return false
}

// AtLeast reports whether the caller's role is role or stronger.
func (p Project) AtLeast(role string) bool {
	return slices.Index(rank, p.Role) >= slices.Index(rank, role) && slices.Index(rank, role) >= 0
}

// Stronger is the stronger of two roles ("" counts as none).
func Stronger(a, b string) string {
	if slices.Index(rank, a) >= slices.Index(rank, b) {
		return a
	}
	return b
}

type key struct{}

// With returns ctx carrying p.
func With(ctx context.Context, p Project) context.Context { return context.WithValue(ctx, key{}, p) }

// From is the project context of ctx.
func From(ctx context.Context) (Project, bool) {
	p, ok := ctx.Value(key{}).(Project)
	return p, ok
}
