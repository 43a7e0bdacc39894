package storage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/storagedb"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Access is what a caller may do with a bucket.
type Access string

const (
	// Read lists, reads and stats objects and gets the bucket.
	Read Access = projectctx.GrantRead
	// ReadWrite also puts and deletes objects.
	ReadWrite Access = projectctx.GrantReadWrite
)

// covers reports whether a holds at least need.
func (a Access) covers(need Access) bool {
	return a == ReadWrite || (a == Read && need == Read)
}

// Bucket states.
const (
	StateActive   = "active"
	StateDeleting = "deleting"
)

// Bucket is an authorised bucket: who owns it and what the caller may do with it.
type Bucket struct {
	// ID is the row's uuid (blob keys, object rows and attachments use it).
	ID        uuid.UUID
	TenantID  uuid.UUID
	ProjectID uuid.UUID // the owner project
	// BucketID is the user-chosen id, unique in the project.
	BucketID  string
	State     string
	CreatedBy uuid.NullUUID
	CreatedAt time.Time
	UpdatedAt time.Time
	// Access is the caller's: ReadWrite for owner-project members (member and above),
	// else the strongest of the caller's grants and a viewer's read.
	Access Access
}

// BucketNotFound is the one answer for a bucket the caller may not see, whatever the
// reason (no such bucket, another tenant's, no role and no grant): the contract has no
// bucket code of its own, so it is storage_object_not_found naming the bucket.
func BucketNotFound(bucketID string) *apierr.Error {
	return apierr.New(apierr.StorageObjectNotFound, "bucket %q not found", bucketID).
		With("resource", "bucket").With("bucket_id", bucketID)
}

// Authorize resolves bucketID in ownerProject and decides whether caller may use it with
// need: an owner-project member (viewer and above read, member and above write), or the
// holder of a grant to their user, their service account or a project of the same tenant
// they act in. A bucket being force-deleted is gone for everyone. No access at all, or
// another tenant: BucketNotFound (404). Read access asking to write: 403
// insufficient_permissions. storage/objects and storage/attach call it before they read
// a body or change anything.
func (s *Service) Authorize(ctx context.Context, caller *principal.Principal, ownerProject uuid.UUID, bucketID string, need Access) (Bucket, error) {
	return s.authorize(ctx, caller, ownerProject, bucketID, need, nil)
}

// authorize is Authorize; role, when not nil, is the caller's role in ownerProject as
// the chain already resolved it (tenancy.Access: membership raised to admin for a
// tenant admin, a machine's token role), which spares a second probe of the same row.
func (s *Service) authorize(ctx context.Context, caller *principal.Principal, ownerProject uuid.UUID, bucketID string, need Access, role *string) (Bucket, error) {
	b, err := s.resolve(ctx, caller, ownerProject, bucketID, role)
	if err != nil {
		return Bucket{}, err
	}
	if b.Access == "" || b.State != StateActive {
		return Bucket{}, BucketNotFound(bucketID)
	}
	if !b.Access.covers(need) {
		return Bucket{}, apierr.Forbidden("your access to this bucket is read-only").
			With("access", string(b.Access)).With("required_access", string(need))
	}
	return b, nil
}

// FromContext is Authorize for a request that passed the chain: the project context
// names the owner project (X-Project-ID) and carries the caller's role there (the
// chain's tenancy.Access read it in this request; "" for a grantee who is no member),
// so only the bucket and the caller's grants are read here, in one query. Grants are
// read afresh on every request: a revoked grant stops access at once.
func (s *Service) FromContext(ctx context.Context, bucketID string, need Access) (Bucket, error) {
	p, ok := principal.From(ctx)
	if !ok {
		return Bucket{}, apierr.New(apierr.TokenMissing, "authentication required")
	}
	proj, ok := projectctx.From(ctx)
	if !ok {
		return Bucket{}, BucketNotFound(bucketID)
	}
	role := proj.Role
	return s.authorize(ctx, p, proj.ID, bucketID, need, &role)
}

// resolve loads the bucket with the caller's access (Access "" when none). known, when
// not nil, is the caller's role in ownerProject already resolved in this request;
// otherwise a person's is read (memberRole).
func (s *Service) resolve(ctx context.Context, caller *principal.Principal, ownerProject uuid.UUID, bucketID string, known *string) (Bucket, error) {
	if caller == nil || caller.TenantID == uuid.Nil { // no tenant, no bucket (platform staff act through admin paths)
		return Bucket{}, BucketNotFound(bucketID)
	}
	params := storagedb.BucketAccessParams{UserID: caller.UserID, Person: caller.Machine == nil,
		MachineProjects: []uuid.UUID{}, ProjectID: ownerProject, BucketID: bucketID, TenantID: caller.TenantID}
	role := ""
	if m := caller.Machine; m != nil {
		params.ServiceAccountID = m.ServiceAccountID
		for id := range m.Projects {
			params.MachineProjects = append(params.MachineProjects, id)
		}
		role = m.Projects[ownerProject]
	} else {
		params.TenantAdmin = caller.IsTenantAdmin(caller.TenantID)
	}
	row, err := s.read(ctx).BucketAccess(ctx, params)
	if errors.Is(err, pgx.ErrNoRows) {
		return Bucket{}, BucketNotFound(bucketID)
	}
	if err != nil {
		return Bucket{}, fmt.Errorf("bucket access: %w", err)
	}
	b := bucketOf(row)
	switch {
	case known != nil:
		role = *known
	case caller.Machine == nil:
		if role, err = s.memberRole(ctx, caller, ownerProject); err != nil {
			return Bucket{}, err
		}
	}
	b.Access = Access(row.GrantAccess)
	switch {
	case role != "" && (projectctx.Project{Role: role}).AtLeast(projectctx.RoleMember):
		b.Access = ReadWrite
	case role != "" && b.Access == "":
		b.Access = Read
	}
	return b, nil
}

// memberRole is a person's role in the project ("" none): their membership, or admin
// for the tenant's admins.
func (s *Service) memberRole(ctx context.Context, caller *principal.Principal, projectID uuid.UUID) (string, error) {
	role, err := s.read(ctx).MemberRole(ctx, storagedb.MemberRoleParams{ProjectID: projectID, UserID: caller.UserID})
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("project role: %w", err)
	}
	if caller.IsTenantAdmin(caller.TenantID) {
		role = projectctx.Stronger(role, projectctx.RoleAdmin)
	}
	return role, nil
}

func bucketOf(r storagedb.BucketAccessRow) Bucket {
	return Bucket{ID: r.ID, TenantID: r.TenantID, ProjectID: r.ProjectID, BucketID: r.BucketID, State: r.State,
		CreatedBy: r.CreatedBy, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt}
}

// GrantedProject implements server.BucketGrants: for a storage operation declared
// authz.ProjectRoleOrGrant whose caller's role in the owner project does not cover it,
// the owner project's context with the caller's grant on the bucket (Grant), or
// BucketNotFound for a caller with no role and no grant. A member whose role and grant
// both fall short keeps their context; the chain then refuses them 403.
func (s *Service) GrantedProject(ctx context.Context, p *principal.Principal, projectID uuid.UUID, bucketID string, member projectctx.Project) (projectctx.Project, error) {
	b, err := s.resolve(ctx, p, projectID, bucketID, &member.Role) // member.Role: the chain's tenancy.Access ("" for a non-member)
	var ae *apierr.Error
	if errors.As(err, &ae) && ae.Code == apierr.StorageObjectNotFound && member.ID != uuid.Nil {
		return member, nil // a member asking for a bucket that is not there: the handler says so
	}
	if err != nil {
		return projectctx.Project{}, err
	}
	if member.ID != uuid.Nil {
		member.Grant = grantOnly(b)
		return member, nil
	}
	grant := grantOnly(b)
	if grant == "" || b.State != StateActive {
		return projectctx.Project{}, BucketNotFound(bucketID)
	}
	return projectctx.Project{ID: b.ProjectID, TenantID: b.TenantID, Grant: grant}, nil
}

// grantOnly is the caller's access as far as it comes from a grant.
func grantOnly(b Bucket) string {
	if b.Access == "" {
		return ""
	}
	return string(b.Access)
}
