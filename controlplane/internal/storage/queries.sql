-- Object storage: buckets, grants, quota (package storage). Objects and uploads are
-- written by storage/objects through the reservation primitives here.

-- name: BucketAccess :one
-- The access rule in one probe: the bucket of the owner project (of the caller's tenant)
-- and the strongest grant that reaches the caller: to their user (people), to their
-- service account (machines), or to a project of the tenant they act in (a person's
-- membership, a tenant admin's any project, a machine's token projects). 'read_write'
-- sorts after 'read', so max() is the strongest.
SELECT b.id, b.tenant_id, b.project_id, b.bucket_id, b.state, b.created_by, b.created_at, b.updated_at,
       coalesce(max(g.access), '')::text AS grant_access
FROM storage_buckets b
JOIN projects p ON p.id = b.project_id AND p.deleted_at IS NULL
LEFT JOIN storage_grants g ON g.bucket = b.id AND (
       (g.grantee_kind = 'user' AND g.grantee_id = sqlc.arg('user_id')::uuid AND sqlc.arg('person')::bool)
    OR (g.grantee_kind = 'service_account' AND g.grantee_id = sqlc.arg('service_account_id')::uuid)
    OR (g.grantee_kind = 'project' AND EXISTS (
           SELECT 1 FROM projects gp WHERE gp.id = g.grantee_id AND gp.tenant_id = b.tenant_id AND gp.deleted_at IS NULL
           AND (gp.id = ANY(sqlc.arg('machine_projects')::uuid[])
                OR (sqlc.arg('person')::bool AND (sqlc.arg('tenant_admin')::bool
                    OR EXISTS (SELECT 1 FROM project_members m WHERE m.project_id = gp.id AND m.user_id = sqlc.arg('user_id')::uuid)))))))
WHERE b.project_id = sqlc.arg('project_id') AND b.bucket_id = sqlc.arg('bucket_id') AND b.tenant_id = sqlc.arg('tenant_id')
GROUP BY b.id;

-- name: MemberRole :one
SELECT m.role FROM project_members m JOIN projects p ON p.id = m.project_id AND p.deleted_at IS NULL
WHERE m.project_id = $1 AND m.user_id = $2;

-- name: InsertBucket :one
-- A taken bucket_id (also one being force-deleted) inserts nothing: storage_already_exists.
INSERT INTO storage_buckets (id, tenant_id, project_id, bucket_id, state, created_by, created_at, updated_at)
VALUES ($1, $2, $3, $4, 'active', $5, $6, $6)
ON CONFLICT (project_id, bucket_id) DO NOTHING
RETURNING *;

-- name: ListBuckets :many
-- A page of the project's buckets by bucket_id (byte order) with their size and count.
SELECT b.*,
       coalesce((SELECT sum(o.size_bytes) FROM storage_objects o WHERE o.bucket = b.id), 0)::bigint AS size_bytes,
       (SELECT count(*) FROM storage_objects o WHERE o.bucket = b.id)::bigint AS object_count
FROM storage_buckets b
WHERE b.project_id = sqlc.arg('project_id') AND b.bucket_id > sqlc.arg('after')::text
ORDER BY b.bucket_id
LIMIT sqlc.arg('limit');

-- name: BucketStats :one
SELECT coalesce(sum(size_bytes), 0)::bigint AS size_bytes, count(*)::bigint AS object_count
FROM storage_objects WHERE bucket = $1;

-- name: LockBucket :one
SELECT * FROM storage_buckets WHERE project_id = $1 AND bucket_id = $2 FOR UPDATE;

-- name: BucketHasUploads :one
SELECT EXISTS (SELECT 1 FROM storage_uploads WHERE bucket = $1)::bool;

-- name: DeleteBucketRow :exec
DELETE FROM storage_buckets WHERE id = $1;

-- name: MarkBucketDeleting :one
UPDATE storage_buckets SET state = 'deleting', delete_requested_at = $2, updated_at = $2
WHERE id = $1
RETURNING *;

-- name: DeletingBuckets :many
SELECT * FROM storage_buckets WHERE state = 'deleting' ORDER BY delete_requested_at LIMIT $1;

-- name: LockDeletingBucket :one
SELECT * FROM storage_buckets WHERE id = $1 AND state = 'deleting' FOR UPDATE SKIP LOCKED;

-- name: DeleteObjectBatch :one
-- One step of a forced delete: up to n objects of the bucket go, their blobs are queued
-- for deletion, and the caller frees what they used in the same transaction.
WITH victims AS (
    SELECT o.bucket, o.path FROM storage_objects o WHERE o.bucket = sqlc.arg('bucket')
    ORDER BY o.path LIMIT sqlc.arg('n') FOR UPDATE
), gone AS (
    DELETE FROM storage_objects o USING victims v WHERE o.bucket = v.bucket AND o.path = v.path
    RETURNING o.size_bytes, o.blob_key
), queued AS (
    INSERT INTO storage_blob_gc (blob_key, enqueued_at) SELECT blob_key, sqlc.arg('now') FROM gone
    ON CONFLICT (blob_key) DO NOTHING
)
SELECT count(*)::bigint AS objects, coalesce(sum(size_bytes), 0)::bigint AS bytes FROM gone;

-- name: FreeUsage :exec
UPDATE storage_quotas SET used_bytes = used_bytes - sqlc.arg('bytes'), used_objects = used_objects - sqlc.arg('objects'),
       updated_at = sqlc.arg('now')
WHERE project_id = sqlc.arg('project_id');

-- name: ExpiredUploads :many
-- Reservations of uploads that stopped (a crashed control plane or client): freed by the
-- sweeper; SKIP LOCKED so replicas share the work.
SELECT * FROM storage_uploads WHERE expires_at < $1 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED;

-- name: DeleteUploadRow :exec
DELETE FROM storage_uploads WHERE id = $1;

-- name: FreeReservation :exec
UPDATE storage_quotas SET reserved_bytes = reserved_bytes - sqlc.arg('bytes'),
       reserved_objects = reserved_objects - sqlc.arg('objects'), updated_at = sqlc.arg('now')
WHERE project_id = sqlc.arg('project_id');

-- name: QueueBlob :exec
INSERT INTO storage_blob_gc (blob_key, enqueued_at) VALUES ($1, $2) ON CONFLICT (blob_key) DO NOTHING;

-- name: GarbageBlobs :many
SELECT blob_key FROM storage_blob_gc WHERE enqueued_at <= $1 ORDER BY enqueued_at LIMIT $2;

-- name: UnqueueBlob :exec
DELETE FROM storage_blob_gc WHERE blob_key = $1;

-- name: ProjectQuota :one
SELECT * FROM storage_quotas WHERE project_id = $1;

-- name: TenantQuota :one
SELECT * FROM storage_tenant_quotas WHERE tenant_id = $1;

-- name: UpsertTenantQuota :one
INSERT INTO storage_tenant_quotas (tenant_id, max_bytes, max_objects, updated_by, updated_at)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (tenant_id) DO UPDATE SET max_bytes = EXCLUDED.max_bytes, max_objects = EXCLUDED.max_objects,
    updated_by = EXCLUDED.updated_by, updated_at = EXCLUDED.updated_at
RETURNING *;

-- name: TenantExists :one
SELECT EXISTS (SELECT 1 FROM tenants WHERE id = $1)::bool;

-- name: RecountUsage :one
-- The quota invariant's right-hand side (tests and the usage repair).
SELECT coalesce(sum(size_bytes), 0)::bigint AS bytes, count(*)::bigint AS objects
FROM storage_objects WHERE project_id = $1;

-- name: ProjectInTenant :one
SELECT EXISTS (SELECT 1 FROM projects WHERE id = $1 AND tenant_id = $2 AND deleted_at IS NULL)::bool;

-- name: UserInTenant :one
SELECT EXISTS (SELECT 1 FROM users WHERE id = $1 AND tenant_id = $2)::bool;

-- name: ServiceAccountInTenant :one
SELECT EXISTS (SELECT 1 FROM service_accounts WHERE id = $1 AND tenant_id = $2 AND deleted_at IS NULL)::bool;

-- name: InsertGrant :one
INSERT INTO storage_grants (id, bucket, tenant_id, grantee_kind, grantee_id, access, created_by, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (bucket, grantee_kind, grantee_id) DO NOTHING
RETURNING *;

-- name: ListGrants :many
SELECT * FROM storage_grants WHERE bucket = sqlc.arg('bucket') AND id > sqlc.arg('after')::uuid
ORDER BY id LIMIT sqlc.arg('limit');

-- name: DeleteGrant :one
DELETE FROM storage_grants WHERE id = $1 AND bucket = $2 RETURNING *;
