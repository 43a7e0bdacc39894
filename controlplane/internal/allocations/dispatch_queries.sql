-- Queries of the provisioning dispatcher (dispatch.go).

-- name: GetTaskForDispatch :one
-- The task with its allocation's status, and whether a newer task of the same
-- allocation replaced it (a retried release sends a new task).
SELECT t.task_id, t.allocation_id, t.node_id, t.kind, t.created_at, t.acked_at, t.finished_at, t.attempts,
       t.last_error, t.cleanup, a.status AS allocation_status,
       EXISTS (SELECT 1 FROM allocation_tasks n
               WHERE n.allocation_id = t.allocation_id
                 AND (n.created_at, n.task_id) > (t.created_at, t.task_id))::boolean AS superseded
FROM allocation_tasks t JOIN allocations a ON a.id = t.allocation_id
WHERE t.task_id = $1;

-- name: GetTaskWithPayload :one
-- GetTaskForDispatch with what a pending task's payload needs, in one read: the
-- allocation's tenant, project, SSH keys and OS image, and its GPUs by index.
SELECT t.task_id, t.allocation_id, t.node_id, t.kind, t.created_at, t.acked_at, t.finished_at, t.attempts,
       t.cleanup, a.status AS allocation_status,
       EXISTS (SELECT 1 FROM allocation_tasks n
               WHERE n.allocation_id = t.allocation_id
                 AND (n.created_at, n.task_id) > (t.created_at, t.task_id))::boolean AS superseded,
       a.tenant_id, a.project_id, a.ssh_public_keys, a.os_image_id,
       ARRAY(SELECT g.gpu_uuid FROM allocation_gpus g WHERE g.allocation_id = t.allocation_id
             ORDER BY g.gpu_index, g.gpu_uuid)::text[] AS gpu_uuids,
       ARRAY(SELECT g.gpu_index FROM allocation_gpus g WHERE g.allocation_id = t.allocation_id
             ORDER BY g.gpu_index, g.gpu_uuid)::integer[] AS gpu_indexes
FROM allocation_tasks t JOIN allocations a ON a.id = t.allocation_id
WHERE t.task_id = $1;

-- name: LockTaskAllocation :one
-- The allocation of a task, locked (every change to an allocation's tasks happens under
-- its lock).
SELECT a.* FROM allocations a
WHERE a.id = (SELECT t.allocation_id FROM allocation_tasks t WHERE t.task_id = $1)
FOR UPDATE;

-- name: MarkTaskAcked :exec
-- The agent acknowledged the task (first time only; the caller, holding the
-- allocation's lock, has read that it was not acknowledged yet).
UPDATE allocation_tasks
SET acked_at = sqlc.arg('acked_at'), attempts = GREATEST(attempts, sqlc.arg('attempts')::integer)
WHERE task_id = sqlc.arg('task_id') AND acked_at IS NULL;

-- name: RecordTaskAttempt :exec
-- A delivery attempt that did not reach the agent (node offline, no ack in time).
UPDATE allocation_tasks
SET attempts = GREATEST(attempts, sqlc.arg('attempts')::integer), last_error = sqlc.arg('last_error')
WHERE task_id = sqlc.arg('task_id') AND acked_at IS NULL AND finished_at IS NULL;

-- name: GiveUpTask :exec
-- The dispatcher stops delivering the task (refused by the agent, or past its deadline):
-- finished, with the reason.
UPDATE allocation_tasks
SET attempts = GREATEST(attempts, sqlc.arg('attempts')::integer), last_error = sqlc.arg('last_error'),
    finished_at = sqlc.arg('finished_at')
WHERE task_id = sqlc.arg('task_id') AND finished_at IS NULL;

-- name: UnreportedTasks :many
-- Tasks an agent acknowledged before acked_before and never reported on, oldest first
-- (the partial index allocation_tasks_unreported_idx holds only these).
SELECT task_id FROM allocation_tasks
WHERE acked_at IS NOT NULL AND finished_at IS NULL AND acked_at < sqlc.arg('acked_before')
ORDER BY acked_at, task_id
LIMIT sqlc.arg('max_tasks');

-- GPU ownership (cleanup.go).

-- name: InsertCleanupTask :exec
-- A release task that confirms the workload gone from the node, delivered whatever the
-- allocation's status (the allocation ended without that confirmation).
INSERT INTO allocation_tasks (task_id, allocation_id, node_id, kind, created_at, cleanup)
VALUES ($1, $2, $3, 'allocation.release', $4, true);

-- name: CleanupConfirmed :exec
-- The node confirmed the workload gone: its GPUs are free for placement again, and its
-- open cleanup tasks are done.
WITH freed AS (
    UPDATE allocation_gpus SET released_at = sqlc.arg('at') WHERE allocation_id = sqlc.arg('allocation_id') AND released_at IS NULL
), done AS (
    UPDATE allocation_tasks SET finished_at = sqlc.arg('at')
    WHERE allocation_id = sqlc.arg('allocation_id') AND cleanup AND finished_at IS NULL
)
UPDATE allocations SET node_cleanup = false WHERE id = sqlc.arg('allocation_id');

-- name: SetNodeCleanup :exec
UPDATE allocations SET node_cleanup = true WHERE id = $1;

-- name: CleanupOpen :one
-- Whether the allocation has a cleanup task its node has not reported on.
SELECT EXISTS (SELECT 1 FROM allocation_tasks WHERE allocation_id = $1 AND cleanup AND finished_at IS NULL)::boolean;

-- name: ReconcileCandidates :many
-- What a node's reconcile looks at: the allocations the agent says it holds, and those
-- waiting for cleanup whose GPUs are held on the node (allocation_gpus_held_key); with
-- whether a cleanup task is open, and every task id of the allocation (a task the agent
-- is still running means its workload may appear yet).
SELECT a.id, a.node_id, a.status, a.node_cleanup,
       EXISTS (SELECT 1 FROM allocation_tasks t WHERE t.allocation_id = a.id AND t.cleanup AND t.finished_at IS NULL)::boolean AS cleanup_open,
       ARRAY(SELECT t.task_id::text FROM allocation_tasks t WHERE t.allocation_id = a.id)::text[] AS task_ids
FROM allocations a
WHERE a.id = ANY(sqlc.arg('held_ids')::uuid[])
   OR (a.node_cleanup AND a.id IN (SELECT g.allocation_id FROM allocation_gpus g WHERE g.node_id = sqlc.arg('node_id') AND g.released_at IS NULL))
ORDER BY a.id;

-- name: HoldFreedGPUs :execrows
-- An ended allocation whose workload the node still holds takes back those of its GPUs
-- nobody has claimed since they were freed (a GPU another live allocation holds now
-- stays with it; the unique index allocation_gpus_held_key decides).
UPDATE allocation_gpus g SET released_at = NULL
WHERE g.allocation_id = $1 AND g.released_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM allocation_gpus h
                  WHERE h.node_id = g.node_id AND h.gpu_uuid = g.gpu_uuid AND h.released_at IS NULL);
