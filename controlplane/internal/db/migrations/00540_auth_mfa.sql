-- TOTP multi-factor authentication (docs/api.md, "MFA and step-up").
--
-- auth_totp_factors: one row per user with a TOTP factor. The secrets are sealed with
-- AES-256-GCM under the master key (additional data binds them to the user), never
-- stored in clear. secret_enc is the active factor (NULL until the first verify);
-- pending_secret_enc is an enrolment waiting for its first code. last_used_step is the
-- RFC 6238 time-step of the last accepted code: a code of that step or an earlier one is
-- refused, so a code cannot be replayed within its window.
--
-- auth_recovery_codes: one-time recovery codes, stored as HMAC-SHA256 under a key
-- derived from the master key (never in clear); used_at is set once.
--
-- auth_mfa_recovery_requests: support-assisted recovery requests. Nothing approves them
-- automatically: an administrator decides, out of band.

-- +goose Up
CREATE TABLE auth_totp_factors (
    user_id            uuid PRIMARY KEY REFERENCES users (id) ON DELETE CASCADE,
    secret_enc         bytea,
    activated_at       timestamptz,
    last_used_step     bigint,
    pending_secret_enc bytea,
    pending_created_at timestamptz,
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL,
    CHECK ((secret_enc IS NULL) = (activated_at IS NULL)),
    CHECK ((pending_secret_enc IS NULL) = (pending_created_at IS NULL))
);

CREATE TABLE auth_recovery_codes (
    id         uuid PRIMARY KEY,
    user_id    uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    code_hash  bytea NOT NULL CHECK (octet_length(code_hash) = 32),
    created_at timestamptz NOT NULL,
    used_at    timestamptz,
    UNIQUE (user_id, code_hash)
);

CREATE TABLE auth_mfa_recovery_requests (
    id         uuid PRIMARY KEY,
    user_id    uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    tenant_id  uuid,
    reason     text NOT NULL,
    status     text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'approved', 'rejected')),
    created_at timestamptz NOT NULL,
    decided_at timestamptz
);
-- At most one open request per user: a second submission answers the open one.
CREATE UNIQUE INDEX auth_mfa_recovery_requests_open_idx ON auth_mfa_recovery_requests (user_id) WHERE status = 'pending';

-- +goose Down
DROP TABLE auth_mfa_recovery_requests;
DROP TABLE auth_recovery_codes;
DROP TABLE auth_totp_factors;
