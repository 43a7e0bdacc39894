package storage

import (
	"context"

	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers is the buckets, grants and quota slice of the strict server.
type Handlers struct {
	Svc     *Service
	Cursors pagination.Codec
}

// NewHandlers returns the handlers over svc.
func NewHandlers(svc *Service, cursors pagination.Codec) *Handlers {
	return &Handlers{Svc: svc, Cursors: cursors}
}

func notWired() error {
	return apierr.New(apierr.ServiceUnavailable, "object storage is not wired yet")
}

func (*Handlers) ListStorageBuckets(context.Context, api.ListStorageBucketsRequestObject) (api.ListStorageBucketsResponseObject, error) {
	return nil, notWired()
}

func (*Handlers) CreateStorageBucket(context.Context, api.CreateStorageBucketRequestObject) (api.CreateStorageBucketResponseObject, error) {
	return nil, notWired()
}

func (*Handlers) GetStorageBucket(context.Context, api.GetStorageBucketRequestObject) (api.GetStorageBucketResponseObject, error) {
	return nil, notWired()
}

func (*Handlers) DeleteStorageBucket(context.Context, api.DeleteStorageBucketRequestObject) (api.DeleteStorageBucketResponseObject, error) {
	return nil, notWired()
}

func (*Handlers) ListStorageGrants(context.Context, api.ListStorageGrantsRequestObject) (api.ListStorageGrantsResponseObject, error) {
	return nil, notWired()
}

func (*Handlers) CreateStorageGrant(context.Context, api.CreateStorageGrantRequestObject) (api.CreateStorageGrantResponseObject, error) {
	return nil, notWired()
}

func (*Handlers) DeleteStorageGrant(context.Context, api.DeleteStorageGrantRequestObject) (api.DeleteStorageGrantResponseObject, error) {
	return nil, notWired()
}

func (*Handlers) GetStorageQuota(context.Context, api.GetStorageQuotaRequestObject) (api.GetStorageQuotaResponseObject, error) {
	return nil, notWired()
}

func (*Handlers) GetTenantStorageQuota(context.Context, api.GetTenantStorageQuotaRequestObject) (api.GetTenantStorageQuotaResponseObject, error) {
	return nil, notWired()
}

func (*Handlers) PutTenantStorageQuota(context.Context, api.PutTenantStorageQuotaRequestObject) (api.PutTenantStorageQuotaResponseObject, error) {
	return nil, notWired()
}
