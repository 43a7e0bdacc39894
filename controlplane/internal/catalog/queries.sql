-- Regions ------------------------------------------------------------------------

-- name: InsertRegion :one
-- ON CONFLICT keeps the transaction usable when the code is taken.
INSERT INTO catalog_regions (code, api_region_code, label, is_default, availability_state,
                             capacity_scope_hint, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $7)
ON CONFLICT DO NOTHING
RETURNING *;

-- name: LockRegion :one
SELECT * FROM catalog_regions WHERE code = $1 FOR UPDATE;

-- name: UpdateRegion :one
UPDATE catalog_regions SET api_region_code = $2, label = $3, is_default = $4, availability_state = $5,
    capacity_scope_hint = $6, updated_at = $7
WHERE code = $1
RETURNING *;

-- name: ClearDefaultRegion :exec
UPDATE catalog_regions SET is_default = false, updated_at = $1 WHERE is_default AND code <> $2;

-- name: AllRegions :many
SELECT * FROM catalog_regions ORDER BY code LIMIT 256;

-- name: CountRegions :one
SELECT count(*) FROM catalog_regions WHERE code = ANY(@codes::text[]);

-- SKUs ---------------------------------------------------------------------------

-- name: InsertSKU :one
INSERT INTO catalog_skus (id, display_name, gpu_model, gpu_count, vcpu, memory_gib, disk_gib, usage_unit,
                          regions, active, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11)
ON CONFLICT DO NOTHING
RETURNING *;

-- name: GetSKU :one
SELECT * FROM catalog_skus WHERE id = $1;

-- name: GetSKUForLaunch :one
-- A launch's catalog read in one statement: the SKU with the availability_state of each
-- of its regions, in the SKU's order ('' for a region that no longer exists).
SELECT sqlc.embed(catalog_skus),
       ARRAY(SELECT COALESCE(r.availability_state, '')
             FROM unnest(catalog_skus.regions) WITH ORDINALITY AS u(code, n)
             LEFT JOIN catalog_regions r ON r.code = u.code
             ORDER BY u.n)::text[] AS region_states
FROM catalog_skus WHERE id = $1;

-- name: LockSKU :one
SELECT * FROM catalog_skus WHERE id = $1 FOR UPDATE;

-- name: UpdateSKU :one
UPDATE catalog_skus SET display_name = $2, vcpu = $3, memory_gib = $4, disk_gib = $5, usage_unit = $6,
    regions = $7, active = $8, updated_at = $9
WHERE id = $1
RETURNING *;

-- name: DeleteSKU :execrows
DELETE FROM catalog_skus WHERE id = $1;

-- name: ListSKUs :many
SELECT * FROM catalog_skus
WHERE (sqlc.narg('after')::text IS NULL OR id > sqlc.narg('after')::text)
  AND (NOT sqlc.arg('active_only')::boolean OR active)
ORDER BY id
LIMIT $1;

-- OS images ----------------------------------------------------------------------

-- name: InsertOSImage :one
INSERT INTO catalog_os_images (id, name, display_name, distribution, version, image_ref, is_default, active,
                               created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)
ON CONFLICT DO NOTHING
RETURNING *;

-- name: GetOSImage :one
SELECT * FROM catalog_os_images WHERE id = $1;

-- name: LockOSImage :one
SELECT * FROM catalog_os_images WHERE id = $1 FOR UPDATE;

-- name: UpdateOSImage :one
UPDATE catalog_os_images SET display_name = $2, version = $3, image_ref = $4, is_default = $5, active = $6,
    updated_at = $7
WHERE id = $1
RETURNING *;

-- name: ClearDefaultOSImage :exec
UPDATE catalog_os_images SET is_default = false, updated_at = $1 WHERE is_default AND id <> $2;

-- name: DeleteOSImage :one
DELETE FROM catalog_os_images WHERE id = $1 RETURNING *;

-- name: ListOSImages :many
SELECT * FROM catalog_os_images
WHERE (sqlc.narg('after')::text IS NULL OR name > sqlc.narg('after')::text)
  AND (NOT sqlc.arg('active_only')::boolean OR active)
ORDER BY name
LIMIT $1;

-- name: LockDefaultFlag :exec
-- Serializes the moves of a default flag (regions, OS images) so that two concurrent
-- "make this the default" requests cannot both clear and set it.
SELECT pg_advisory_xact_lock(hashtext(@flag::text));
