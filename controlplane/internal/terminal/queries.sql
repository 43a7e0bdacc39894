-- Terminal tokens and sessions (docs/terminal.md). Times come from the injected clock,
-- never from now(), so tests can move time.

-- name: InsertToken :exec
INSERT INTO terminal_tokens (id, token_hash, user_id, tenant_id, project_id, allocation_id, session_id, reattach,
    cols, rows, created_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12);

-- name: ConsumeToken :one
-- The one atomic consume: of any number of concurrent callers exactly one gets the row.
UPDATE terminal_tokens SET consumed_at = sqlc.arg(now)::timestamptz
WHERE token_hash = sqlc.arg(token_hash) AND consumed_at IS NULL AND expires_at > sqlc.arg(now)::timestamptz
RETURNING *;

-- name: TokenState :one
-- Why a consume failed: unknown (no row), replayed (consumed_at set) or expired; and
-- whose token it was (the refusal is audited as that user's).
SELECT consumed_at, expires_at, user_id, tenant_id, project_id FROM terminal_tokens WHERE token_hash = $1;

-- name: BurnToken :exec
-- A token that travelled somewhere it must not (a query string) is spent unused.
UPDATE terminal_tokens SET consumed_at = sqlc.arg(now)::timestamptz
WHERE token_hash = sqlc.arg(token_hash) AND consumed_at IS NULL;

-- name: PruneTokens :execrows
DELETE FROM terminal_tokens WHERE expires_at < sqlc.arg(before)::timestamptz;

-- name: GetSession :one
SELECT * FROM terminal_sessions WHERE id = $1;

-- name: LockSession :one
SELECT * FROM terminal_sessions WHERE id = $1 FOR UPDATE;

-- name: InsertSession :one
INSERT INTO terminal_sessions (id, tenant_id, project_id, allocation_id, node_id, user_id, status, attachment,
    cols, rows, started_at, attached_at)
VALUES ($1, $2, $3, $4, $5, $6, 'attached', 1, $7, $8, $9, $9)
ON CONFLICT (id) DO NOTHING
RETURNING *;

-- name: SetSessionState :one
UPDATE terminal_sessions SET status = sqlc.arg(status), attachment = sqlc.arg(attachment),
    attached_at = sqlc.arg(attached_at), detached_at = sqlc.narg(detached_at), ended_at = sqlc.narg(ended_at),
    ended_by = sqlc.narg(ended_by), exit_code = sqlc.narg(exit_code)
WHERE id = sqlc.arg(id)
RETURNING *;

-- name: ExpiredDetachedSessions :many
SELECT id FROM terminal_sessions
WHERE status = 'detached' AND detached_at <= sqlc.arg(before)::timestamptz
ORDER BY detached_at
LIMIT sqlc.arg(max_rows);

-- name: LiveSessionsOfAllocation :many
SELECT id, project_id, status FROM terminal_sessions WHERE allocation_id = $1 AND status <> 'ended';
