package storage

import (
	"context"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers is the buckets, grants and quota slice of the strict server. The chain has
// decided the caller's role (or grant) in the owner project before any of them runs.
type Handlers struct {
	Svc     *Service
	Cursors pagination.Codec
}

// NewHandlers returns the handlers over svc.
func NewHandlers(svc *Service, cursors pagination.Codec) *Handlers {
	return &Handlers{Svc: svc, Cursors: cursors}
}

const (
	sortBuckets = "storage_buckets.bucket_id"
	sortGrants  = "storage_grants.id"
)

func callerAndProject(ctx context.Context) (*principal.Principal, projectctx.Project, error) {
	p, ok := principal.From(ctx)
	if !ok {
		return nil, projectctx.Project{}, apierr.New(apierr.TokenMissing, "authentication required")
	}
	proj, ok := projectctx.From(ctx)
	if !ok {
		return nil, projectctx.Project{}, apierr.Forbidden("you do not have access to this project")
	}
	return p, proj, nil
}

func apiBucket(v BucketView) api.StorageBucket {
	out := api.StorageBucket{BucketID: v.BucketID, ProjectID: v.ProjectID, State: api.StorageBucketState(v.State),
		SizeBytes: v.SizeBytes, ObjectCount: v.ObjectCount, CreatedAt: v.CreatedAt, UpdatedAt: v.UpdatedAt}
	if v.CreatedBy.Valid {
		id := v.CreatedBy.UUID
		out.CreatedBy = &id
	}
	if v.Access != "" {
		a := api.StorageAccess(v.Access)
		out.Access = &a
	}
	return out
}

func apiGrant(bucketID string, g Grant) api.StorageGrant {
	out := api.StorageGrant{GrantID: g.ID, BucketID: bucketID, GranteeKind: api.StorageGranteeKind(g.GranteeKind),
		GranteeID: g.GranteeID, Access: api.StorageAccess(g.Access), CreatedAt: g.CreatedAt}
	if g.CreatedBy.Valid {
		id := g.CreatedBy.UUID
		out.CreatedBy = &id
	}
	return out
}

// ListStorageBuckets implements GET /api/v1/storage/buckets.
func (h *Handlers) ListStorageBuckets(ctx context.Context, req api.ListStorageBucketsRequestObject) (api.ListStorageBucketsResponseObject, error) {
	_, proj, err := callerAndProject(ctx)
	if err != nil {
		return nil, err
	}
	var after string
	if err := h.Cursors.DecodeAfter(req.Params.Cursor, sortBuckets+":"+proj.ID.String(), &after); err != nil {
		return nil, err
	}
	size := pagination.Size(req.Params.PageSize)
	items, more, err := h.Svc.ListBuckets(ctx, proj.ID, after, size)
	if err != nil {
		return nil, err
	}
	out := api.StorageBucketListResponse{Items: make([]api.StorageBucket, 0, len(items)), Pagination: api.Pagination{PageSize: size}}
	for _, b := range items {
		out.Items = append(out.Items, apiBucket(b))
	}
	if more {
		if out.Pagination.NextCursor, err = h.Cursors.Next(true, sortBuckets+":"+proj.ID.String(), items[len(items)-1].BucketID); err != nil {
			return nil, err
		}
	}
	return api.ListStorageBuckets200JSONResponse{Body: out}, nil
}

// CreateStorageBucket implements POST /api/v1/storage/buckets.
func (h *Handlers) CreateStorageBucket(ctx context.Context, req api.CreateStorageBucketRequestObject) (api.CreateStorageBucketResponseObject, error) {
	_, proj, err := callerAndProject(ctx)
	if err != nil {
		return nil, err
	}
	if req.Body == nil {
		return nil, apierr.Validation("body", "a body is required")
	}
	b, err := h.Svc.CreateBucket(ctx, proj, req.Body.BucketID)
	if err != nil {
		return nil, err
	}
	return api.CreateStorageBucket201JSONResponse{Body: apiBucket(b)}, nil
}

// GetStorageBucket implements GET /api/v1/storage/buckets/{bucket_id}: owner-project
// members also see the grants; a grantee sees the bucket without them.
func (h *Handlers) GetStorageBucket(ctx context.Context, req api.GetStorageBucketRequestObject) (api.GetStorageBucketResponseObject, error) {
	p, proj, err := callerAndProject(ctx)
	if err != nil {
		return nil, err
	}
	b, err := h.Svc.GetBucket(ctx, p, proj.ID, req.BucketID)
	if err != nil {
		return nil, err
	}
	out := apiBucket(b)
	if proj.Role != "" {
		grants, _, err := h.Svc.ListGrants(ctx, b.Bucket, uuid.Nil, pagination.MaxSize)
		if err != nil {
			return nil, err
		}
		out.Grants = make([]api.StorageGrant, 0, len(grants))
		for _, g := range grants {
			out.Grants = append(out.Grants, apiGrant(b.BucketID, g))
		}
	}
	return api.GetStorageBucket200JSONResponse{Body: out}, nil
}

// DeleteStorageBucket implements DELETE /api/v1/storage/buckets/{bucket_id}.
func (h *Handlers) DeleteStorageBucket(ctx context.Context, req api.DeleteStorageBucketRequestObject) (api.DeleteStorageBucketResponseObject, error) {
	_, proj, err := callerAndProject(ctx)
	if err != nil {
		return nil, err
	}
	force := req.Params.Force != nil && *req.Params.Force
	b, deleted, err := h.Svc.DeleteBucket(ctx, proj, req.BucketID, force)
	if err != nil {
		return nil, err
	}
	if deleted {
		return api.DeleteStorageBucket204Response{}, nil
	}
	return api.DeleteStorageBucket202JSONResponse{Body: apiBucket(b)}, nil
}

// ownBucket is the bucket bucketID of the caller's project (members only: the chain
// admitted them by role), active or not.
func (h *Handlers) ownBucket(ctx context.Context, bucketID string, active bool) (Bucket, error) {
	p, proj, err := callerAndProject(ctx)
	if err != nil {
		return Bucket{}, err
	}
	b, err := h.Svc.resolve(ctx, p, proj.ID, bucketID, nil)
	if err != nil {
		return Bucket{}, err
	}
	if b.Access == "" || (active && b.State != StateActive) {
		return Bucket{}, BucketNotFound(bucketID)
	}
	return b, nil
}

// ListStorageGrants implements GET /api/v1/storage/buckets/{bucket_id}/grants.
func (h *Handlers) ListStorageGrants(ctx context.Context, req api.ListStorageGrantsRequestObject) (api.ListStorageGrantsResponseObject, error) {
	b, err := h.ownBucket(ctx, req.BucketID, false)
	if err != nil {
		return nil, err
	}
	var after uuid.UUID
	if err := h.Cursors.DecodeAfter(req.Params.Cursor, sortGrants+":"+b.ID.String(), &after); err != nil {
		return nil, err
	}
	size := pagination.Size(req.Params.PageSize)
	grants, more, err := h.Svc.ListGrants(ctx, b, after, size)
	if err != nil {
		return nil, err
	}
	out := api.StorageGrantListResponse{Items: make([]api.StorageGrant, 0, len(grants)), Pagination: api.Pagination{PageSize: size}}
	for _, g := range grants {
		out.Items = append(out.Items, apiGrant(b.BucketID, g))
	}
	if more {
		if out.Pagination.NextCursor, err = h.Cursors.Next(true, sortGrants+":"+b.ID.String(), grants[len(grants)-1].ID); err != nil {
			return nil, err
		}
	}
	return api.ListStorageGrants200JSONResponse{Body: out}, nil
}

// CreateStorageGrant implements POST /api/v1/storage/buckets/{bucket_id}/grants.
func (h *Handlers) CreateStorageGrant(ctx context.Context, req api.CreateStorageGrantRequestObject) (api.CreateStorageGrantResponseObject, error) {
	b, err := h.ownBucket(ctx, req.BucketID, true)
	if err != nil {
		return nil, err
	}
	if req.Body == nil {
		return nil, apierr.Validation("body", "a body is required")
	}
	g, err := h.Svc.CreateGrant(ctx, b, string(req.Body.GranteeKind), req.Body.GranteeID, Access(req.Body.Access))
	if err != nil {
		return nil, err
	}
	return api.CreateStorageGrant201JSONResponse{Body: apiGrant(b.BucketID, g)}, nil
}

// DeleteStorageGrant implements DELETE /api/v1/storage/buckets/{bucket_id}/grants/{grant_id}.
func (h *Handlers) DeleteStorageGrant(ctx context.Context, req api.DeleteStorageGrantRequestObject) (api.DeleteStorageGrantResponseObject, error) {
	b, err := h.ownBucket(ctx, req.BucketID, false)
	if err != nil {
		return nil, err
	}
	if err := h.Svc.RevokeGrant(ctx, b, req.GrantID); err != nil {
		return nil, err
	}
	return api.DeleteStorageGrant204Response{}, nil
}

// GetStorageQuota implements GET /api/v1/storage/quota.
func (h *Handlers) GetStorageQuota(ctx context.Context, _ api.GetStorageQuotaRequestObject) (api.GetStorageQuotaResponseObject, error) {
	_, proj, err := callerAndProject(ctx)
	if err != nil {
		return nil, err
	}
	q, err := h.Svc.ProjectQuota(ctx, proj.ID, proj.TenantID)
	if err != nil {
		return nil, err
	}
	return api.GetStorageQuota200JSONResponse{Body: api.StorageQuota{ProjectID: q.ProjectID, UsedBytes: q.UsedBytes,
		UsedObjects: q.UsedObjects, ReservedBytes: q.ReservedBytes, ReservedObjects: q.ReservedObjects,
		MaxBytes: q.MaxBytes, MaxObjects: q.MaxObjects, Source: api.StorageQuotaSource(q.Source)}}, nil
}

func apiTenantQuota(tenantID uuid.UUID, l Limits) api.TenantStorageQuota {
	return api.TenantStorageQuota{TenantID: tenantID, MaxBytes: l.MaxBytes, MaxObjects: l.MaxObjects,
		Source: api.StorageQuotaSource(l.Source), UpdatedAt: l.UpdatedAt}
}

// GetTenantStorageQuota implements GET /api/v1/admin/tenants/{tenant_id}/storage-quota.
func (h *Handlers) GetTenantStorageQuota(ctx context.Context, req api.GetTenantStorageQuotaRequestObject) (api.GetTenantStorageQuotaResponseObject, error) {
	l, err := h.Svc.GetTenantLimits(ctx, req.TenantID)
	if err != nil {
		return nil, err
	}
	return api.GetTenantStorageQuota200JSONResponse{Body: apiTenantQuota(req.TenantID, l)}, nil
}

// PutTenantStorageQuota implements PUT /api/v1/admin/tenants/{tenant_id}/storage-quota.
func (h *Handlers) PutTenantStorageQuota(ctx context.Context, req api.PutTenantStorageQuotaRequestObject) (api.PutTenantStorageQuotaResponseObject, error) {
	if req.Body == nil {
		return nil, apierr.Validation("body", "a body is required")
	}
	l, err := h.Svc.SetTenantLimits(ctx, req.TenantID, req.Body.MaxBytes, req.Body.MaxObjects)
	if err != nil {
		return nil, err
	}
	return api.PutTenantStorageQuota200JSONResponse{Body: apiTenantQuota(req.TenantID, l)}, nil
}
