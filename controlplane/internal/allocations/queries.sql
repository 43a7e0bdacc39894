-- name: InsertAllocation :one
INSERT INTO allocations (
    id, tenant_id, project_id, owner_user_id, name, sku, gpu_model, gpu_count, usage_unit, region_code,
    node_id, os_image_id, ssh_key_ids, ssh_public_keys, status, hourly_rate_minor, currency, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $18)
RETURNING *;

-- name: InsertGPU :exec
INSERT INTO allocation_gpus (allocation_id, node_id, gpu_uuid, gpu_index, reserved_at)
VALUES ($1, $2, $3, $4, $5);

-- name: InsertEvent :one
INSERT INTO allocation_events (id, allocation_id, from_status, to_status, event, reason, actor_type, actor_id,
    correlation_id, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
RETURNING *;

-- name: GetAllocation :one
SELECT * FROM allocations WHERE id = $1 AND project_id = $2;

-- name: GetAllocationAny :one
SELECT * FROM allocations WHERE id = $1;

-- name: LockAllocation :one
SELECT * FROM allocations WHERE id = $1 FOR UPDATE;

-- name: ListAllocations :many
SELECT * FROM allocations
WHERE project_id = $1 AND (sqlc.narg('after')::uuid IS NULL OR id > sqlc.narg('after')::uuid)
ORDER BY id
LIMIT $2;

-- name: ListEvents :many
SELECT * FROM allocation_events
WHERE allocation_id = $1 AND (sqlc.narg('after')::uuid IS NULL OR id > sqlc.narg('after')::uuid)
ORDER BY id
LIMIT $2;

-- name: SetStatus :one
UPDATE allocations
SET status = $2, status_reason = $3, updated_at = $4,
    active_at = CASE WHEN $2 = 'active' AND active_at IS NULL THEN $4 ELSE active_at END,
    ended_at = CASE WHEN $2 IN ('released', 'failed', 'completed') THEN $4 ELSE ended_at END,
    node_cleanup = node_cleanup OR sqlc.arg('cleanup')::boolean
WHERE id = $1
RETURNING *;

-- name: FreeGPUs :exec
UPDATE allocation_gpus SET released_at = $2 WHERE allocation_id = $1 AND released_at IS NULL;

-- name: CountLiveInProject :one
SELECT count(*) FROM allocations
WHERE project_id = $1 AND status NOT IN ('released', 'failed', 'completed');

-- name: HeldGPUs :many
SELECT node_id, gpu_uuid FROM allocation_gpus WHERE released_at IS NULL ORDER BY node_id, gpu_uuid;

-- name: HeldGPUsOnNodes :many
SELECT node_id, gpu_uuid FROM allocation_gpus
WHERE released_at IS NULL AND node_id = ANY(sqlc.arg('node_ids')::uuid[]);

-- name: NodeInUse :one
SELECT EXISTS (SELECT 1 FROM allocation_gpus WHERE node_id = $1 AND released_at IS NULL);

-- name: SKUInUse :one
SELECT EXISTS (SELECT 1 FROM allocations WHERE sku = $1 AND status NOT IN ('released', 'failed', 'completed'));

-- name: AllocationGPUs :many
SELECT * FROM allocation_gpus WHERE allocation_id = $1 ORDER BY gpu_index;

-- name: LockKey :exec
-- A transaction-scoped advisory lock on a named key (project, GPU model).
SELECT pg_advisory_xact_lock(hashtextextended(sqlc.arg(key)::text, 0));

-- name: ListAllAllocations :many
SELECT * FROM allocations
WHERE (sqlc.narg('tenant_id')::uuid IS NULL OR tenant_id = sqlc.narg('tenant_id')::uuid)
  AND (sqlc.narg('status')::text IS NULL OR status = sqlc.narg('status')::text)
  AND (sqlc.narg('after')::uuid IS NULL OR id > sqlc.narg('after')::uuid)
ORDER BY id
LIMIT $1;

-- name: SetConnection :exec
UPDATE allocations SET connection_host = $2, connection_port = $3, connection_user = $4 WHERE id = $1;

-- name: InsertTask :exec
INSERT INTO allocation_tasks (task_id, allocation_id, node_id, kind, created_at) VALUES ($1, $2, $3, $4, $5);

-- name: GetTask :one
SELECT * FROM allocation_tasks WHERE task_id = $1;

-- name: FinishTask :exec
UPDATE allocation_tasks SET finished_at = $2 WHERE task_id = $1 AND finished_at IS NULL;
