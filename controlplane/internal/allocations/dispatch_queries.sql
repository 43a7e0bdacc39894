-- Queries of the provisioning dispatcher (dispatch.go).

-- name: GetTaskForDispatch :one
-- The task with its allocation's status, and whether a newer task of the same
-- allocation replaced it (a retried release sends a new task).
SELECT t.task_id, t.allocation_id, t.node_id, t.kind, t.created_at, t.acked_at, t.finished_at, t.attempts,
       t.last_error, a.status AS allocation_status,
       EXISTS (SELECT 1 FROM allocation_tasks n
               WHERE n.allocation_id = t.allocation_id
                 AND (n.created_at, n.task_id) > (t.created_at, t.task_id))::boolean AS superseded
FROM allocation_tasks t JOIN allocations a ON a.id = t.allocation_id
WHERE t.task_id = $1;

-- name: MarkTaskAcked :execrows
-- The agent acknowledged the task (first time only).
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
