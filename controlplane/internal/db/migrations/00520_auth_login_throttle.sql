-- Per-account sign-in backoff (docs/api.md, Sign-in limits). One row per normalized
-- username with recent failed sign-ins, known user or not, so that the answer never tells
-- whether an account exists. The key is the SHA-256 of the normalized username: what
-- people type into the username field (sometimes a password) is not kept in clear.
-- Rows are forgotten after GANTRY_LOGIN_FAILURE_MEMORY without failures, and deleted on a
-- successful sign-in. Shared by every replica, like the accounts it protects.

-- +goose Up
CREATE TABLE auth_login_throttle (
    username_hash   bytea PRIMARY KEY CHECK (octet_length(username_hash) = 32),
    failures        integer NOT NULL CHECK (failures >= 0),
    last_failure_at timestamptz NOT NULL,
    -- Sign-ins are refused (429) until then; NULL while under the free failures.
    locked_until    timestamptz
);
CREATE INDEX auth_login_throttle_last_failure_idx ON auth_login_throttle (last_failure_at);

-- +goose Down
DROP TABLE auth_login_throttle;
