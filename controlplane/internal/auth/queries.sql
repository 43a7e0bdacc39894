-- Signing keys ---------------------------------------------------------------

-- name: LockSigningKeys :exec
-- Serializes key creation and rotation across control-plane replicas (released at
-- the end of the transaction).
SELECT pg_advisory_xact_lock(@lock_id::bigint);

-- name: GetActiveSigningKey :one
SELECT kid, created_at FROM auth_signing_keys WHERE state = 'active';

-- name: InsertSigningKey :exec
INSERT INTO auth_signing_keys (kid, algorithm, public_jwk, private_key_enc, state, created_at)
VALUES (@kid, 'RS256', @public_jwk, @private_key_enc, 'active', @created_at);

-- name: RetireSigningKey :execrows
UPDATE auth_signing_keys
SET state = 'retired', retired_at = @retired_at, expires_at = @expires_at
WHERE kid = @kid AND state = 'active';

-- name: ListPublishedSigningKeys :many
-- The active key and every retired key still inside its publication window.
SELECT kid, algorithm, public_jwk, private_key_enc, state, created_at, expires_at
FROM auth_signing_keys
WHERE state = 'active' OR expires_at > @now
ORDER BY created_at DESC;

-- Identity facts ---------------------------------------------------------------

-- name: GetUserByUsername :one
SELECT u.id, u.username, u.password_hash, u.role, u.status, u.tenant_id, u.tenant_role,
       t.status AS tenant_status
FROM users u LEFT JOIN tenants t ON t.id = u.tenant_id
WHERE u.username = @username;

-- name: GetUserByID :one
SELECT u.id, u.username, u.role, u.status, u.tenant_id, u.tenant_role,
       t.status AS tenant_status
FROM users u LEFT JOIN tenants t ON t.id = u.tenant_id
WHERE u.id = @id;

-- name: ListPlatformRoleBindings :many
SELECT role FROM platform_role_bindings WHERE user_id = @user_id ORDER BY role;

-- Refresh tokens ---------------------------------------------------------------

-- name: InsertRefreshToken :exec
INSERT INTO auth_refresh_tokens (id, token_hash, family_id, user_id, created_at, expires_at)
VALUES (@id, @token_hash, @family_id, @user_id, @created_at, @expires_at);

-- name: GetRefreshTokenForUpdate :one
-- Row lock: of concurrent refreshes of one token exactly one sees it unused.
SELECT id, family_id, user_id, created_at, expires_at, used_at, revoked_at
FROM auth_refresh_tokens
WHERE token_hash = @token_hash
FOR UPDATE;

-- name: MarkRefreshTokenUsed :exec
UPDATE auth_refresh_tokens SET used_at = @used_at WHERE id = @id;

-- name: RevokeRefreshFamily :execrows
UPDATE auth_refresh_tokens SET revoked_at = @revoked_at
WHERE family_id = @family_id AND revoked_at IS NULL;

-- name: DeleteExpiredRefreshTokens :execrows
DELETE FROM auth_refresh_tokens WHERE expires_at < @before;

-- name: EnsureLoginThrottle :exec
INSERT INTO auth_login_throttle (username_hash, failures, last_failure_at)
VALUES (@username_hash, 0, @now)
ON CONFLICT (username_hash) DO NOTHING;

-- name: LockLoginThrottle :one
SELECT failures, last_failure_at, locked_until
FROM auth_login_throttle
WHERE username_hash = @username_hash
FOR UPDATE;

-- name: ChargeLoginFailure :exec
UPDATE auth_login_throttle
SET failures = @failures, last_failure_at = @now, locked_until = @locked_until
WHERE username_hash = @username_hash;

-- name: ClearLoginThrottle :exec
DELETE FROM auth_login_throttle WHERE username_hash = @username_hash;

-- name: PruneLoginThrottle :execrows
-- Bounded, so a sign-in never pays for a large backlog.
DELETE FROM auth_login_throttle
WHERE username_hash IN (
    SELECT t.username_hash FROM auth_login_throttle t
    WHERE t.last_failure_at < @forgotten_before AND (t.locked_until IS NULL OR t.locked_until < @now::timestamptz)
    LIMIT 100
);
