-- name: GetObject :one
SELECT * FROM storage_objects WHERE bucket = $1 AND path = $2;

-- name: LockObject :one
-- The commit of a PUT or DELETE holds the row until it ends, so two writers of one path
-- take turns and each sees the other's result.
SELECT * FROM storage_objects WHERE bucket = $1 AND path = $2 FOR UPDATE;

-- name: InsertObject :one
-- ON CONFLICT: a concurrent first PUT of the same path committed after LockObject found
-- nothing; the caller locks that row and decides again.
INSERT INTO storage_objects (bucket, path, project_id, blob_key, size_bytes, etag, content_type, created_by, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)
ON CONFLICT (bucket, path) DO NOTHING
RETURNING *;

-- name: ReplaceObject :one
UPDATE storage_objects
SET blob_key = $3, size_bytes = $4, etag = $5, content_type = $6, created_by = $7, updated_at = $8
WHERE bucket = $1 AND path = $2
RETURNING *;

-- name: DeleteObject :exec
DELETE FROM storage_objects WHERE bucket = $1 AND path = $2;

-- name: ListObjects :many
-- A page of paths from start (and past it when skip names it) that begin with the
-- prefix: path >= start and path < prefix_end bound one range scan of the primary key
-- (an OR around the start would make it read the bucket from its first row). Only what a
-- listing answers is read (no blob key, creator or creation time): a page is 200 rows.
SELECT path, size_bytes, etag, content_type, updated_at FROM storage_objects
WHERE bucket = sqlc.arg('bucket')
  AND path >= sqlc.arg('start')
  AND (sqlc.narg('prefix_end')::text IS NULL OR path < sqlc.narg('prefix_end')::text COLLATE "C")
  AND (sqlc.narg('skip')::text IS NULL OR path <> sqlc.narg('skip')::text COLLATE "C")
  AND starts_with(path, sqlc.arg('prefix'))
ORDER BY path
LIMIT sqlc.arg('lim');

-- name: QueueBlob :exec
INSERT INTO storage_blob_gc (blob_key, enqueued_at) VALUES ($1, $2) ON CONFLICT (blob_key) DO NOTHING;

-- name: UnqueueBlob :exec
DELETE FROM storage_blob_gc WHERE blob_key = $1;

-- name: LockBucketState :one
-- FOR SHARE: a commit and a forced delete's switch to 'deleting' take turns, so no
-- object is committed into a bucket the sweeper has already emptied.
SELECT state FROM storage_buckets WHERE id = $1 FOR SHARE;

-- name: EnsureQuota :exec
INSERT INTO storage_quotas (project_id, tenant_id, updated_at) VALUES ($1, $2, $3)
ON CONFLICT (project_id) DO NOTHING;

-- name: ReserveQuota :one
-- One conditional UPDATE: concurrent reservations serialise on the project's row and
-- each sees the others' reservations, so together they never pass the limit. The limit
-- is the tenant's default (an admin's) or the platform's.
UPDATE storage_quotas q
SET reserved_bytes = q.reserved_bytes + sqlc.arg('bytes')::bigint,
    reserved_objects = q.reserved_objects + sqlc.arg('objects')::bigint,
    updated_at = sqlc.arg('now')
WHERE q.project_id = sqlc.arg('project_id')
  AND q.used_bytes + q.reserved_bytes + sqlc.arg('bytes')::bigint <= COALESCE(
      (SELECT t.max_bytes FROM storage_tenant_quotas t WHERE t.tenant_id = q.tenant_id), sqlc.arg('default_max_bytes')::bigint)
  AND q.used_objects + q.reserved_objects + sqlc.arg('objects')::bigint <= COALESCE(
      (SELECT t.max_objects FROM storage_tenant_quotas t WHERE t.tenant_id = q.tenant_id), sqlc.arg('default_max_objects')::bigint)
RETURNING q.used_bytes, q.reserved_bytes, q.used_objects, q.reserved_objects;

-- name: InsertUpload :exec
INSERT INTO storage_uploads (id, project_id, bucket, blob_key, reserved_bytes, reserved_objects, started_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8);

-- name: GrowUpload :execrows
UPDATE storage_uploads SET reserved_bytes = reserved_bytes + sqlc.arg('bytes')::bigint, expires_at = sqlc.arg('expires_at')
WHERE id = sqlc.arg('id');

-- name: ExtendUpload :execrows
UPDATE storage_uploads SET expires_at = $2 WHERE id = $1;

-- name: DeleteUpload :one
DELETE FROM storage_uploads WHERE id = $1 RETURNING project_id, reserved_bytes, reserved_objects;

-- name: SettleQuota :execrows
-- used moves by what the commit changed; reserved gives back the whole reservation.
UPDATE storage_quotas
SET used_bytes = used_bytes + sqlc.arg('used_bytes')::bigint,
    used_objects = used_objects + sqlc.arg('used_objects')::bigint,
    reserved_bytes = reserved_bytes - sqlc.arg('reserved_bytes')::bigint,
    reserved_objects = reserved_objects - sqlc.arg('reserved_objects')::bigint,
    updated_at = sqlc.arg('now')
WHERE project_id = sqlc.arg('project_id');

