// Package storage owns object storage's buckets, grants and quota (docs/storage.md):
// bucket create, list, get and delete (a forced delete marks the bucket deleting and a
// sweeper removes its objects in batches, freeing quota as it goes), grants of a bucket
// to another project, a user or a service account of the same tenant, the access rule
// every storage operation goes through (Authorize), the per-project quota with the
// tenant default an admin sets, and the reservation primitives uploads use so that
// concurrent uploads never push usage past the quota (Reserve, Grow, Commit, Release).
//
// It never touches object bytes itself except to delete blobs that nothing references
// any more (the blob garbage queue, expired uploads, force-deleted buckets): reading and
// writing objects is storage/objects, attaching buckets to allocations storage/attach.
package storage
