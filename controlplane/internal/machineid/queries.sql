-- name: InsertMachineUser :exec
-- A machine identity's own users row: no password, no tenant (machineid doc.go).
INSERT INTO users (id, username, display_name, password_hash, role, status, created_at, updated_at)
VALUES (sqlc.arg('id'), sqlc.arg('username'), sqlc.arg('display_name'), NULL, 'user', 'active', sqlc.arg('now'), sqlc.arg('now'));

-- name: DisableMachineUser :exec
UPDATE users SET status = 'disabled', updated_at = sqlc.arg('now') WHERE id = sqlc.arg('id');

-- name: LiveTenantProject :one
SELECT id FROM projects WHERE id = sqlc.arg('project_id') AND tenant_id = sqlc.arg('tenant_id') AND deleted_at IS NULL;

-- name: InsertServiceAccount :exec
INSERT INTO service_accounts (id, tenant_id, user_id, name, description, created_by, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: InsertServiceAccountProjectRole :exec
INSERT INTO service_account_project_roles (service_account_id, project_id, role, created_at)
VALUES ($1, $2, $3, $4)
ON CONFLICT (service_account_id, project_id) DO UPDATE SET role = excluded.role;

-- name: ListServiceAccounts :many
SELECT * FROM service_accounts
WHERE tenant_id = sqlc.arg('tenant_id') AND deleted_at IS NULL
  AND (sqlc.narg('after')::uuid IS NULL OR id > sqlc.narg('after'))
ORDER BY id
LIMIT sqlc.arg('lim');

-- name: ListServiceAccountProjectRoles :many
-- Roles in live projects only: a deleted project's binding confers nothing.
SELECT r.service_account_id, r.project_id, r.role
FROM service_account_project_roles r
JOIN projects p ON p.id = r.project_id AND p.deleted_at IS NULL
WHERE r.service_account_id = ANY(sqlc.arg('ids')::uuid[])
ORDER BY r.service_account_id, r.project_id;

-- name: LockLiveServiceAccount :one
SELECT * FROM service_accounts
WHERE id = sqlc.arg('id') AND tenant_id = sqlc.arg('tenant_id') AND deleted_at IS NULL
FOR UPDATE;

-- name: MarkServiceAccountDeleted :exec
UPDATE service_accounts SET deleted_at = sqlc.arg('now') WHERE id = sqlc.arg('id');

-- name: RevokeServiceAccountCredentials :exec
UPDATE access_credentials SET revoked_at = sqlc.arg('now'), revoked_by = sqlc.arg('by')
WHERE service_account_id = sqlc.arg('service_account_id') AND revoked_at IS NULL;

-- name: InsertCredential :one
INSERT INTO access_credentials (id, tenant_id, kind, service_account_id, project_id, project_role, user_id,
                                name, client_id, secret_hash, expires_at, created_by, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
RETURNING *;

-- name: ListCredentials :many
-- Newest first (ids are UUIDv7). Every filter is optional.
SELECT * FROM access_credentials
WHERE (sqlc.narg('tenant_id')::uuid IS NULL OR tenant_id = sqlc.narg('tenant_id'))
  AND (sqlc.narg('project_id')::uuid IS NULL OR project_id = sqlc.narg('project_id'))
  AND (sqlc.narg('kind')::text IS NULL OR kind = sqlc.narg('kind'))
  AND (sqlc.narg('status')::text IS NULL
       OR (sqlc.narg('status') = 'revoked' AND revoked_at IS NOT NULL)
       OR (sqlc.narg('status') = 'expired' AND revoked_at IS NULL AND expires_at <= sqlc.arg('now'))
       OR (sqlc.narg('status') = 'active' AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > sqlc.arg('now'))))
  AND (sqlc.narg('before')::uuid IS NULL OR id < sqlc.narg('before'))
ORDER BY id DESC
LIMIT sqlc.arg('lim');

-- name: LockCredential :one
SELECT * FROM access_credentials WHERE id = sqlc.arg('id') FOR UPDATE;

-- name: RevokeCredential :exec
UPDATE access_credentials SET revoked_at = sqlc.arg('now'), revoked_by = sqlc.arg('by')
WHERE id = sqlc.arg('id') AND revoked_at IS NULL;

-- name: CredentialForGrant :one
-- Everything the grant checks, in one probe of the client_id index.
SELECT c.id, c.tenant_id, c.kind, c.service_account_id, c.project_id, c.project_role, c.user_id,
       c.secret_hash, c.expires_at, c.revoked_at, c.last_used_at, u.username,
       t.status AS tenant_status,
       (sa.id IS NOT NULL AND sa.deleted_at IS NOT NULL)::boolean AS service_account_deleted,
       (p.id IS NOT NULL AND p.deleted_at IS NOT NULL)::boolean AS project_deleted
FROM access_credentials c
JOIN users u ON u.id = c.user_id
JOIN tenants t ON t.id = c.tenant_id
LEFT JOIN service_accounts sa ON sa.id = c.service_account_id
LEFT JOIN projects p ON p.id = c.project_id
WHERE c.client_id = sqlc.arg('client_id');

-- name: TouchCredential :exec
-- last_used_at to the minute: at most one write per credential per minute.
UPDATE access_credentials SET last_used_at = sqlc.arg('now')
WHERE id = sqlc.arg('id') AND (last_used_at IS NULL OR last_used_at < sqlc.arg('now')::timestamptz - interval '1 minute');
