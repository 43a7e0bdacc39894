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
-- password_sign_in: whether the user's tenant lets passwords sign in (true without a
-- tenant or an identity provider; oidc.go).
SELECT u.id, u.username, u.password_hash, u.role, u.status, u.tenant_id, u.tenant_role,
       t.status AS tenant_status, coalesce(p.password_sign_in, true)::boolean AS password_sign_in
FROM users u LEFT JOIN tenants t ON t.id = u.tenant_id
LEFT JOIN tenant_identity_providers p ON p.tenant_id = u.tenant_id
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

-- name: LockLoginThrottle :one
-- The key's record, created when missing (no failures yet), locked until the end of the
-- transaction: the no-op update of a conflict takes the row lock, and one statement
-- cannot lose the row to a concurrent ClearLoginThrottle between insert and lock.
INSERT INTO auth_login_throttle (username_hash, failures, last_failure_at)
VALUES (@username_hash, 0, @now)
ON CONFLICT (username_hash) DO UPDATE SET username_hash = EXCLUDED.username_hash
RETURNING failures, last_failure_at, locked_until;

-- name: GetLoginThrottleLock :one
-- Reads a key's lock without taking the row (the client-credentials grant, machine.go).
SELECT locked_until FROM auth_login_throttle WHERE username_hash = @username_hash;

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

-- TOTP factors (mfa.go) ----------------------------------------------------------

-- name: GetTOTPFactor :one
SELECT user_id, secret_enc, activated_at, last_used_step, pending_secret_enc, pending_created_at, created_at
FROM auth_totp_factors WHERE user_id = @user_id;

-- name: GetTOTPFactorForUpdate :one
SELECT user_id, secret_enc, activated_at, last_used_step, pending_secret_enc, pending_created_at, created_at
FROM auth_totp_factors WHERE user_id = @user_id
FOR UPDATE;

-- name: UpsertPendingTOTP :exec
INSERT INTO auth_totp_factors (user_id, pending_secret_enc, pending_created_at, created_at, updated_at)
VALUES (@user_id, @pending_secret_enc, @now::timestamptz, @now::timestamptz, @now::timestamptz)
ON CONFLICT (user_id) DO UPDATE
SET pending_secret_enc = EXCLUDED.pending_secret_enc, pending_created_at = EXCLUDED.pending_created_at,
    updated_at = EXCLUDED.updated_at;

-- name: ActivatePendingTOTP :execrows
-- The pending secret becomes the active factor; the verifying code's step is spent.
UPDATE auth_totp_factors
SET secret_enc = pending_secret_enc, activated_at = @now::timestamptz, last_used_step = @step::bigint,
    pending_secret_enc = NULL, pending_created_at = NULL, updated_at = @now
WHERE user_id = @user_id AND pending_secret_enc IS NOT NULL;

-- name: SpendTOTPStep :execrows
-- Accepts a code of time-step @step once: 0 rows when that step (or a later one) was
-- already used, which is how a replayed code is refused, also between concurrent requests.
UPDATE auth_totp_factors
SET last_used_step = @step::bigint, updated_at = @now
WHERE user_id = @user_id AND secret_enc IS NOT NULL
  AND (last_used_step IS NULL OR last_used_step < @step::bigint);

-- name: DeleteRecoveryCodes :exec
DELETE FROM auth_recovery_codes WHERE user_id = @user_id;

-- name: InsertRecoveryCode :exec
INSERT INTO auth_recovery_codes (id, user_id, code_hash, created_at)
VALUES (@id, @user_id, @code_hash, @created_at);

-- name: UseRecoveryCode :execrows
UPDATE auth_recovery_codes SET used_at = @now::timestamptz
WHERE user_id = @user_id AND code_hash = @code_hash AND used_at IS NULL;

-- name: CountUnusedRecoveryCodes :one
SELECT count(*) FROM auth_recovery_codes WHERE user_id = @user_id AND used_at IS NULL;

-- name: CountActiveSessions :one
-- Sessions are refresh-token families with a live, unspent, unrevoked token.
SELECT count(DISTINCT family_id) FROM auth_refresh_tokens
WHERE user_id = @user_id AND used_at IS NULL AND revoked_at IS NULL AND expires_at > @now;

-- MFA recovery requests -----------------------------------------------------------

-- name: InsertMFARecoveryRequest :one
INSERT INTO auth_mfa_recovery_requests (id, user_id, tenant_id, reason, status, created_at)
VALUES (@id, @user_id, @tenant_id, @reason, 'pending', @created_at)
ON CONFLICT (user_id) WHERE status = 'pending' DO NOTHING
RETURNING id, status, created_at;

-- name: GetOpenMFARecoveryRequest :one
SELECT id, status, created_at FROM auth_mfa_recovery_requests
WHERE user_id = @user_id AND status = 'pending';

-- MFA readiness -------------------------------------------------------------------

-- name: MFAReadiness :many
-- Holders of the privileged platform roles (the bindings: users.role = 'admin' always
-- has its superadmin binding, migration 00550) and whether each has an active TOTP factor.
WITH holders AS (
    SELECT b.user_id, b.role
    FROM platform_role_bindings b JOIN users u ON u.id = b.user_id
    WHERE b.role IN ('platform_superadmin', 'platform_ops') AND u.status = 'active'
)
SELECT h.role::text AS role,
       count(*)::bigint AS holders,
       count(*) FILTER (WHERE f.secret_enc IS NULL)::bigint AS without_mfa
FROM holders h LEFT JOIN auth_totp_factors f ON f.user_id = h.user_id
GROUP BY h.role ORDER BY h.role;

-- name: MFAReadinessTotals :one
WITH holders AS (
    SELECT DISTINCT b.user_id FROM platform_role_bindings b JOIN users u ON u.id = b.user_id
    WHERE b.role IN ('platform_superadmin', 'platform_ops') AND u.status = 'active'
)
SELECT count(*)::bigint AS holders,
       count(*) FILTER (WHERE f.secret_enc IS NULL)::bigint AS without_mfa,
       (SELECT count(*) FROM auth_mfa_recovery_requests r WHERE r.status = 'pending')::bigint AS pending_recovery_requests
FROM holders h LEFT JOIN auth_totp_factors f ON f.user_id = h.user_id;

-- Platform role bindings (platformroles.go) ----------------------------------------

-- name: LockPlatformRoles :exec
-- Serializes every change of platform role bindings (and of a superadmin's status), so
-- the "keep one active superadmin" check cannot race (released at the end of the
-- transaction).
SELECT pg_advisory_xact_lock(@lock_id::bigint);

-- name: ListAllPlatformRoleBindings :many
SELECT b.user_id, b.role, b.granted_by, b.created_at AS granted_at, u.username
FROM platform_role_bindings b JOIN users u ON u.id = b.user_id
ORDER BY b.role, u.username;

-- name: GetPlatformRoleBinding :one
SELECT b.user_id, b.role, b.granted_by, b.created_at AS granted_at, u.username
FROM platform_role_bindings b JOIN users u ON u.id = b.user_id
WHERE b.user_id = @user_id AND b.role = @role;

-- name: InsertPlatformRoleBinding :execrows
INSERT INTO platform_role_bindings (user_id, role, granted_by, created_at)
VALUES (@user_id, @role, @granted_by, @granted_at)
ON CONFLICT (user_id, role) DO NOTHING;

-- name: DeletePlatformRoleBinding :execrows
DELETE FROM platform_role_bindings WHERE user_id = @user_id AND role = @role;

-- name: CountActiveSuperadmins :one
SELECT count(*)::bigint FROM platform_role_bindings b JOIN users u ON u.id = b.user_id
WHERE b.role = 'platform_superadmin' AND u.status = 'active';

-- name: SetUserRole :exec
-- users.role follows the superadmin binding (the contract's User.role).
UPDATE users SET role = @role, updated_at = @updated_at WHERE id = @id;

-- Admin users (adminusers.go) ---------------------------------------------------------

-- name: ListAdminUsers :many
-- q is a LIKE pattern with its wildcards escaped by the caller.
SELECT u.id, u.username, u.display_name, u.role, u.status, u.tenant_id, u.tenant_role,
       u.created_at, u.updated_at,
       EXISTS (SELECT 1 FROM auth_totp_factors f WHERE f.user_id = u.id AND f.secret_enc IS NOT NULL) AS mfa_enabled,
       COALESCE((SELECT array_agg(b.role ORDER BY b.role) FROM platform_role_bindings b WHERE b.user_id = u.id), '{}')::text[] AS platform_roles
FROM users u
WHERE (sqlc.narg('after')::uuid IS NULL OR u.id > sqlc.narg('after')::uuid)
  AND (sqlc.narg('q')::text IS NULL OR u.username ILIKE sqlc.narg('q')::text OR u.display_name ILIKE sqlc.narg('q')::text)
  AND (sqlc.narg('tenant_id')::uuid IS NULL OR u.tenant_id = sqlc.narg('tenant_id')::uuid)
  AND (sqlc.narg('status')::text IS NULL OR u.status = sqlc.narg('status')::text)
ORDER BY u.id
LIMIT @max_rows;

-- name: GetAdminUser :one
SELECT u.id, u.username, u.display_name, u.role, u.status, u.tenant_id, u.tenant_role,
       u.created_at, u.updated_at,
       EXISTS (SELECT 1 FROM auth_totp_factors f WHERE f.user_id = u.id AND f.secret_enc IS NOT NULL) AS mfa_enabled,
       COALESCE((SELECT array_agg(b.role ORDER BY b.role) FROM platform_role_bindings b WHERE b.user_id = u.id), '{}')::text[] AS platform_roles
FROM users u WHERE u.id = @id;

-- name: LockUser :one
SELECT status, tenant_id FROM users WHERE id = @id FOR UPDATE;

-- name: SetUserStatus :exec
UPDATE users SET status = @status, updated_at = @updated_at WHERE id = @id;

-- name: RevokeUserRefreshTokens :execrows
-- Disabling a user ends every session at once.
UPDATE auth_refresh_tokens SET revoked_at = @revoked_at WHERE user_id = @user_id AND revoked_at IS NULL;

-- name: DeleteTOTPFactor :execrows
DELETE FROM auth_totp_factors WHERE user_id = @user_id;

-- name: ApproveOpenMFARecoveryRequest :execrows
UPDATE auth_mfa_recovery_requests SET status = 'approved', decided_at = @decided_at
WHERE user_id = @user_id AND status = 'pending';

-- Enterprise sign-in (oidc.go) ---------------------------------------------------

-- name: UpsertIdentityProvider :one
INSERT INTO tenant_identity_providers (tenant_id, issuer, client_id, client_secret_enc, redirect_url,
    allowed_domains, role_claim, role_mapping, password_sign_in, created_at, updated_at)
VALUES (@tenant_id, @issuer, @client_id, @client_secret_enc, @redirect_url,
    @allowed_domains::text[], @role_claim, @role_mapping, @password_sign_in, @now, @now)
ON CONFLICT (tenant_id) DO UPDATE SET issuer = EXCLUDED.issuer, client_id = EXCLUDED.client_id,
    client_secret_enc = EXCLUDED.client_secret_enc, redirect_url = EXCLUDED.redirect_url,
    allowed_domains = EXCLUDED.allowed_domains, role_claim = EXCLUDED.role_claim,
    role_mapping = EXCLUDED.role_mapping, password_sign_in = EXCLUDED.password_sign_in,
    updated_at = EXCLUDED.updated_at
RETURNING tenant_id, issuer, client_id, redirect_url, allowed_domains, role_claim, role_mapping,
    password_sign_in, created_at, updated_at;

-- name: GetIdentityProvider :one
SELECT tenant_id, issuer, client_id, client_secret_enc, redirect_url, allowed_domains, role_claim,
    role_mapping, password_sign_in, created_at, updated_at
FROM tenant_identity_providers WHERE tenant_id = @tenant_id;

-- name: DeleteIdentityProvider :execrows
DELETE FROM tenant_identity_providers WHERE tenant_id = @tenant_id;

-- name: GetTenantForSignIn :one
SELECT id, slug, kind, status FROM tenants WHERE slug = @slug;

-- name: GetTenantSlugKind :one
SELECT slug, kind FROM tenants WHERE id = @id;

-- name: InsertOIDCFlow :exec
INSERT INTO auth_oidc_flows (state_hash, cookie_hash, tenant_id, nonce, pkce_verifier, created_at, expires_at)
VALUES (@state_hash, @cookie_hash, @tenant_id, @nonce, @pkce_verifier, @now, @expires_at);

-- name: TakeOIDCFlow :one
-- Single use: the row is gone whatever the callback's outcome.
DELETE FROM auth_oidc_flows WHERE state_hash = @state_hash
RETURNING cookie_hash, tenant_id, nonce, pkce_verifier, expires_at;

-- name: DeleteExpiredOIDCFlows :exec
DELETE FROM auth_oidc_flows WHERE expires_at <= @now;

-- name: GetFederatedIdentity :one
SELECT user_id, tenant_id FROM auth_federated_identities WHERE issuer = @issuer AND subject = @subject;

-- name: IsFederatedUser :one
SELECT EXISTS (SELECT 1 FROM auth_federated_identities WHERE user_id = @user_id);

-- name: GetUserForFederation :one
SELECT id, password_hash, tenant_id FROM users WHERE username = @username;

-- name: InsertFederatedUser :exec
INSERT INTO users (id, username, display_name, password_hash, role, tenant_id, tenant_role, status, created_at, updated_at)
VALUES (@id, @username, @display_name, NULL, 'user', @tenant_id, @tenant_role, 'active', @now, @now);

-- name: InsertFederatedIdentity :exec
INSERT INTO auth_federated_identities (user_id, tenant_id, issuer, subject, created_at)
VALUES (@user_id, @tenant_id, @issuer, @subject, @now);

-- name: SetUserTenantRole :exec
UPDATE users SET tenant_role = @tenant_role, updated_at = @now WHERE id = @id AND tenant_role IS DISTINCT FROM @tenant_role;

