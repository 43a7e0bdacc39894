-- Queries of the provisioning dispatcher (dispatch.go).

-- name: GetTaskForDispatch :one
SELECT t.task_id, t.allocation_id, t.node_id, t.kind, t.created_at, t.acked_at, t.finished_at, t.attempts,
       a.status AS allocation_status
FROM allocation_tasks t JOIN allocations a ON a.id = t.allocation_id
WHERE t.task_id = $1;
