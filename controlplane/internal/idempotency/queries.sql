-- name: GetIdempotencyKey :one
SELECT request_hash, status_code, response_body, expires_at
FROM idempotency_keys
WHERE principal = $1 AND method = $2 AND route = $3 AND idempotency_key = $4;

-- name: InsertIdempotencyKey :exec
INSERT INTO idempotency_keys (principal, method, route, idempotency_key, request_hash,
                              status_code, response_body, created_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: DeleteExpiredIdempotencyKey :exec
DELETE FROM idempotency_keys
WHERE principal = $1 AND method = $2 AND route = $3 AND idempotency_key = $4 AND expires_at <= $5;

-- name: DeleteExpiredIdempotencyKeys :execrows
DELETE FROM idempotency_keys WHERE expires_at <= $1;
