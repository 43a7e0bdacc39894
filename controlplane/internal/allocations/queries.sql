-- name: InsertAllocation :one
INSERT INTO allocations (
    id, tenant_id, project_id, owner_user_id, name, sku, gpu_model, gpu_count, usage_unit, region_code,
    node_id, os_image_id, ssh_key_ids, ssh_public_keys, status, hourly_rate_minor, currency, created_at, updated_at,
    group_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $18, sqlc.narg('group_id'))
RETURNING *;

-- name: ClaimGPUs :many
-- Reserves GPUs of one node for an allocation, each only if no live allocation holds it
-- (the partial unique index allocation_gpus_held_key decides): a GPU already held is
-- skipped, one being reserved by a launch not yet committed is waited for and then
-- skipped if that launch commits. The caller sees which it got. The GPUs are inserted by
-- uuid, byte order (as launch.go also gives them), so two launches never wait on each
-- other in a cycle. Only a GPU placement could choose now is reserved: of the model,
-- healthy or not sampled, on a node online and schedulable. Single launches read their
-- candidates from a replica's short-lived hint (hints.go), so the claim is where a node
-- cordoned or gone offline, or a GPU found unhealthy, since that read is turned down:
-- such a GPU comes back as not got, like one another launch holds.
INSERT INTO allocation_gpus (allocation_id, node_id, gpu_uuid, gpu_index, reserved_at)
SELECT sqlc.arg('allocation_id')::uuid, g.node_id, g.gpu_uuid, u.gpu_index, sqlc.arg('reserved_at')::timestamptz
FROM (SELECT unnest(sqlc.arg('gpu_uuids')::text[]) AS gpu_uuid, unnest(sqlc.arg('gpu_indexes')::integer[]) AS gpu_index) AS u
JOIN node_gpus g ON g.node_id = sqlc.arg('node_id')::uuid AND g.gpu_uuid = u.gpu_uuid
JOIN nodes n ON n.id = g.node_id
WHERE g.model = sqlc.arg('model') AND g.healthy IS NOT FALSE
  AND n.status = 'online' AND n.schedule_state = 'schedulable'
ORDER BY u.gpu_uuid COLLATE "C"
ON CONFLICT (node_id, gpu_uuid) WHERE released_at IS NULL DO NOTHING
RETURNING gpu_uuid;

-- name: MoveAllocation :one
-- A launch whose first choice of GPUs was taken meanwhile moves its (uncommitted) row to
-- the node it claims next.
UPDATE allocations SET node_id = $2, region_code = $3 WHERE id = $1
RETURNING *;

-- name: InsertEvent :exec
INSERT INTO allocation_events (id, allocation_id, from_status, to_status, event, reason, actor_type, actor_id,
    correlation_id, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10);

-- name: GetAllocation :one
SELECT * FROM allocations WHERE id = $1 AND project_id = $2;

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
    node_cleanup = node_cleanup OR sqlc.arg('cleanup')::boolean,
    -- Every status change starts the idle observation afresh (docs/allocations.md).
    under_threshold_since = NULL
WHERE id = $1
RETURNING *;

-- name: FreeGPUs :exec
UPDATE allocation_gpus SET released_at = $2 WHERE allocation_id = $1 AND released_at IS NULL;

-- name: CountLiveInProject :one
SELECT count(*) FROM allocations
WHERE project_id = $1 AND status NOT IN ('released', 'failed', 'completed');

-- name: HeldGPUs :many
SELECT node_id, gpu_uuid FROM allocation_gpus WHERE released_at IS NULL ORDER BY node_id, gpu_uuid;

-- name: NodeInUse :one
SELECT EXISTS (SELECT 1 FROM allocation_gpus WHERE node_id = $1 AND released_at IS NULL);

-- name: SKUInUse :one
SELECT EXISTS (SELECT 1 FROM allocations WHERE sku = $1 AND status NOT IN ('released', 'failed', 'completed'));

-- name: LockLaunch :exec
-- A launch's transaction-scoped advisory locks, in the one order every launch takes
-- them: the project's (creates of a project serialize, so its concurrency limit holds),
-- then the GPU model's, shared for a single launch and exclusive for a group (launch.go
-- says why). One round trip; the target list is evaluated left to right.
SELECT pg_advisory_xact_lock(hashtextextended(sqlc.arg('project_key')::text, 0)),
       CASE WHEN sqlc.arg('exclusive')::boolean
            THEN pg_advisory_xact_lock(hashtextextended(sqlc.arg('model_key')::text, 0))
            ELSE pg_advisory_xact_lock_shared(hashtextextended(sqlc.arg('model_key')::text, 0))
       END;

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

-- Allocation groups (groups.go).

-- name: InsertGroup :one
INSERT INTO allocation_groups (id, tenant_id, project_id, owner_user_id, name, sku, member_count, region_code,
    created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)
RETURNING *;

-- name: GetGroup :one
SELECT * FROM allocation_groups WHERE id = $1 AND project_id = $2;

-- name: LockGroup :one
SELECT * FROM allocation_groups WHERE id = $1 AND project_id = $2 FOR UPDATE;

-- name: ListGroups :many
SELECT * FROM allocation_groups
WHERE project_id = $1 AND (sqlc.narg('after')::uuid IS NULL OR id > sqlc.narg('after')::uuid)
ORDER BY id
LIMIT $2;

-- name: GroupMembers :many
SELECT * FROM allocations WHERE group_id = ANY(sqlc.arg('group_ids')::uuid[]) ORDER BY group_id, id;

-- name: LockGroupMembers :many
SELECT * FROM allocations WHERE group_id = $1 ORDER BY id FOR UPDATE;

-- name: TouchGroup :exec
UPDATE allocation_groups SET updated_at = $2 WHERE id = $1;

-- Idle detection (idle.go).

-- name: RunningGPUs :many
-- The GPUs held by active and idle allocations, with the allocation's idle observation.
SELECT a.id, a.status, a.under_threshold_since, g.node_id, g.gpu_uuid
FROM allocations a JOIN allocation_gpus g ON g.allocation_id = a.id AND g.released_at IS NULL
WHERE a.status IN ('active', 'idle')
ORDER BY a.id, g.gpu_uuid;

-- name: MarkUnderThreshold :execrows
-- Compare-and-set: only the first evaluator (any replica) to see it under starts the clock.
UPDATE allocations SET under_threshold_since = $2
WHERE id = $1 AND status = 'active' AND under_threshold_since IS NULL;

-- name: ClearUnderThreshold :execrows
UPDATE allocations SET under_threshold_since = NULL WHERE id = $1 AND under_threshold_since IS NOT NULL;

-- Stop consumers (suspend.go).

-- name: StopScope :many
-- Allocations in a stop request's scope that are running or still being set up: the
-- tenant's, optionally one project's, optionally billed in one currency.
SELECT id, status FROM allocations
WHERE tenant_id = $1
  AND (sqlc.narg('project_id')::uuid IS NULL OR project_id = sqlc.narg('project_id')::uuid)
  AND (sqlc.narg('currency')::text IS NULL OR currency = sqlc.narg('currency')::text)
  AND status IN ('requested', 'provisioning', 'active', 'idle', 'restarting', 'restart_failed')
ORDER BY id;

-- name: StopRequestApplied :one
SELECT EXISTS (SELECT 1 FROM allocation_stop_requests WHERE event_id = $1);

-- name: InsertStopRequest :execrows
INSERT INTO allocation_stop_requests (event_id, event_type, tenant_id, project_id, reason, stopped, released, applied_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (event_id) DO NOTHING;
