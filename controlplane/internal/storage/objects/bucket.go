package objects

import "github.com/google/uuid"

// Bucket is what the object store needs of an authorised bucket.
type Bucket struct {
	ID        uuid.UUID // internal id (storage_buckets.id)
	TenantID  uuid.UUID
	ProjectID uuid.UUID // the owner project
	BucketID  string    // the user's name for it
}
