-- name: InsertKey :one
-- ON CONFLICT keeps the transaction usable when the user already has the key.
INSERT INTO ssh_keys (id, user_id, name, key_type, public_key, comment, fingerprint, bits, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (user_id, fingerprint) DO NOTHING
RETURNING *;

-- name: ListKeys :many
SELECT * FROM ssh_keys
WHERE user_id = $1 AND (sqlc.narg('after')::uuid IS NULL OR id > sqlc.narg('after')::uuid)
ORDER BY id
LIMIT $2;

-- name: AllKeys :many
SELECT * FROM ssh_keys WHERE user_id = $1 ORDER BY id;

-- name: KeysByID :many
SELECT * FROM ssh_keys WHERE user_id = $1 AND id = ANY(sqlc.arg('ids')::uuid[]) ORDER BY id;

-- name: DeleteKey :one
DELETE FROM ssh_keys WHERE id = $1 AND user_id = $2 RETURNING *;
