-- name: LockPKI :exec
SELECT pg_advisory_xact_lock(sqlc.arg(lock_id)::bigint);

-- name: GetCA :one
SELECT id, cert_pem, key_enc, not_after, created_at FROM fabric_ca WHERE singleton;

-- name: InsertCA :exec
INSERT INTO fabric_ca (id, cert_pem, key_enc, not_after, created_at)
VALUES ($1, $2, $3, $4, $5);

-- name: LatestServerCert :one
SELECT id, ca_id, cert_pem, key_enc, names, not_after, created_at
FROM fabric_server_certs
WHERE ca_id = $1 AND names = sqlc.arg(names)::text[]
ORDER BY created_at DESC
LIMIT 1;

-- name: InsertServerCert :exec
INSERT INTO fabric_server_certs (id, ca_id, cert_pem, key_enc, names, not_after, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7);
