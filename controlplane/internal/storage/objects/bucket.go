package objects

import (
	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/storage"
)

// Bucket is what the object store needs of an authorised bucket.
type Bucket struct {
	ID        uuid.UUID // internal id (storage_buckets.id)
	TenantID  uuid.UUID
	ProjectID uuid.UUID // the owner project
	BucketID  string    // the user's name for it
}

// BucketOf is the object store's view of an authorised bucket.
func BucketOf(b storage.Bucket) Bucket {
	return Bucket{ID: b.ID, TenantID: b.TenantID, ProjectID: b.ProjectID, BucketID: b.BucketID}
}
