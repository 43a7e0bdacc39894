-- Storage attachments (storage/attach).

-- name: LockAllocation :one
-- The allocation an attachment is made to or changed on, locked: attachments change
-- under their allocation's lock, so an attach cannot race the allocation's release.
SELECT id, tenant_id, project_id, node_id, status FROM allocations
WHERE id = $1 FOR UPDATE;

-- name: GetAllocation :one
SELECT id, tenant_id, project_id, node_id, status FROM allocations WHERE id = $1;

-- name: InsertAttachment :one
INSERT INTO storage_attachments (id, allocation_id, tenant_id, project_id, bucket, bucket_project, bucket_id,
    mode, mount_path, state, created_by, created_at, updated_at, task_id, task_kind, task_created_at)
VALUES (sqlc.arg('id'), sqlc.arg('allocation_id'), sqlc.arg('tenant_id'), sqlc.arg('project_id'), sqlc.arg('bucket'),
    sqlc.arg('bucket_project'), sqlc.arg('bucket_id'), sqlc.arg('mode'), sqlc.arg('mount_path'), 'attaching',
    sqlc.arg('created_by'), sqlc.arg('created_at'), sqlc.arg('created_at'), sqlc.narg('task_id'),
    -- No task yet (a launch's attachment): it waits for the allocation to become active.
    CASE WHEN sqlc.narg('task_id')::uuid IS NULL THEN NULL ELSE 'storage.attach' END,
    CASE WHEN sqlc.narg('task_id')::uuid IS NULL THEN NULL ELSE sqlc.arg('created_at')::timestamptz END)
ON CONFLICT (allocation_id, mount_path) WHERE state IN ('attaching', 'attached', 'detaching') DO NOTHING
RETURNING *;

-- name: WaitingAttachments :many
-- A launch's attachments still waiting for their allocation to become active, locked.
SELECT * FROM storage_attachments
WHERE allocation_id = $1 AND state = 'attaching' AND task_id IS NULL
ORDER BY id
FOR UPDATE;

-- name: StartAttachTask :one
-- Gives a waiting attachment its storage.attach task (its allocation became active).
UPDATE storage_attachments
SET task_id = sqlc.arg('task_id'), task_kind = 'storage.attach', task_created_at = sqlc.arg('at'),
    task_acked_at = NULL, task_attempts = 0, task_last_error = NULL, updated_at = sqlc.arg('at')
WHERE id = sqlc.arg('id') AND state = 'attaching' AND task_id IS NULL
RETURNING *;

-- name: GetAttachment :one
SELECT * FROM storage_attachments WHERE id = $1 AND allocation_id = $2;

-- name: LockAttachment :one
SELECT * FROM storage_attachments WHERE id = $1 FOR UPDATE;

-- name: ListAttachments :many
-- One page of an allocation's attachments, oldest first.
SELECT * FROM storage_attachments
WHERE allocation_id = sqlc.arg('allocation_id') AND id > sqlc.arg('after')
ORDER BY id
LIMIT sqlc.arg('max_rows');

-- name: SetState :one
-- Applies a transition decided by the state table; task_* describe the task the new
-- state wants (NULL task_id: none).
UPDATE storage_attachments
SET state = sqlc.arg('state'), updated_at = sqlc.arg('at'),
    method = COALESCE(sqlc.narg('method'), method),
    host_path = COALESCE(sqlc.narg('host_path'), host_path),
    error = sqlc.narg('error'),
    attached_at = CASE WHEN sqlc.arg('state')::text = 'attached' AND attached_at IS NULL THEN sqlc.arg('at') ELSE attached_at END,
    detached_at = CASE WHEN sqlc.arg('state')::text IN ('detached', 'failed') THEN sqlc.arg('at') ELSE detached_at END,
    task_id = sqlc.narg('task_id'), task_kind = sqlc.narg('task_kind'),
    task_created_at = CASE WHEN sqlc.narg('task_id')::uuid IS NULL THEN NULL ELSE sqlc.arg('at') END,
    task_acked_at = NULL, task_attempts = 0, task_last_error = NULL
WHERE id = sqlc.arg('id')
RETURNING *;

-- name: LiveAttachmentsOfAllocation :many
-- What an ended allocation still has attached, locked.
SELECT * FROM storage_attachments
WHERE allocation_id = $1 AND state IN ('attaching', 'attached', 'detaching')
ORDER BY id
FOR UPDATE;

-- name: AttachmentByTask :one
SELECT s.id, s.allocation_id, a.node_id FROM storage_attachments s JOIN allocations a ON a.id = s.allocation_id
WHERE s.task_id = $1;

-- name: TaskToDeliver :one
-- The attachment's task while it waits for an acknowledgement, with what its payload
-- and its delivery need.
SELECT s.id, s.allocation_id, s.bucket_id, s.mode, s.mount_path, s.task_id, s.task_kind, s.task_created_at,
       s.task_attempts, a.node_id
FROM storage_attachments s JOIN allocations a ON a.id = s.allocation_id
WHERE s.id = $1 AND s.task_id IS NOT NULL AND s.task_acked_at IS NULL;

-- name: MarkTaskAcked :exec
UPDATE storage_attachments
SET task_acked_at = sqlc.arg('acked_at'), task_attempts = GREATEST(task_attempts, sqlc.arg('attempts')::integer)
WHERE task_id = sqlc.arg('task_id') AND task_acked_at IS NULL;

-- name: RecordTaskAttempt :exec
UPDATE storage_attachments
SET task_attempts = GREATEST(task_attempts, sqlc.arg('attempts')::integer), task_last_error = sqlc.arg('last_error')
WHERE task_id = sqlc.arg('task_id') AND task_acked_at IS NULL;

-- name: PendingTasks :many
-- Tasks not acknowledged yet whose last attempt is older than before, oldest first.
SELECT s.id, s.task_id, s.task_created_at, s.task_attempts, a.node_id FROM storage_attachments s
JOIN allocations a ON a.id = s.allocation_id
WHERE s.task_id IS NOT NULL AND s.task_acked_at IS NULL AND s.task_created_at < sqlc.arg('before')
ORDER BY s.task_created_at
LIMIT sqlc.arg('max_rows');

-- name: UnreportedTasks :many
-- Tasks acknowledged before acked_before and never reported on.
SELECT id, task_id FROM storage_attachments
WHERE task_id IS NOT NULL AND task_acked_at IS NOT NULL AND task_acked_at < sqlc.arg('acked_before')
ORDER BY task_acked_at
LIMIT sqlc.arg('max_rows');

-- name: EndedAllocationsWithAttachments :many
-- Allocations that ended (a missed hook, e.g. an allocation failed by a path that does not
-- call it) while attachments still count as live.
SELECT DISTINCT s.allocation_id FROM storage_attachments s JOIN allocations a ON a.id = s.allocation_id
WHERE s.state IN ('attaching', 'attached', 'detaching') AND a.status IN ('released', 'failed', 'completed')
LIMIT sqlc.arg('max_rows');

-- name: NodeAttachment :one
-- An attachment the node may serve: live, and attached to an allocation on that node.
SELECT s.id, s.bucket, s.bucket_project, s.bucket_id, s.tenant_id, s.project_id, s.mode, s.state, s.created_by, s.allocation_id
FROM storage_attachments s JOIN allocations a ON a.id = s.allocation_id
WHERE s.id = sqlc.arg('id') AND a.node_id = sqlc.arg('node_id') AND s.state IN ('attaching', 'attached', 'detaching');
