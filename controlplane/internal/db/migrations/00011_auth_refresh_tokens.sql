-- Refresh tokens (auth): opaque, single-use, stored only as their SHA-256. Every token
-- belongs to a family (one sign-in); refreshing spends a token and issues the next one
-- of the same family. Presenting a spent token again is reuse and revokes the family.

-- +goose Up
CREATE TABLE auth_refresh_tokens (
    id         uuid PRIMARY KEY,
    token_hash bytea NOT NULL UNIQUE CHECK (octet_length(token_hash) = 32),
    family_id  uuid NOT NULL,
    user_id    uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    used_at    timestamptz,
    revoked_at timestamptz,
    CHECK (expires_at > created_at)
);
CREATE INDEX auth_refresh_tokens_family_idx ON auth_refresh_tokens (family_id);
CREATE INDEX auth_refresh_tokens_user_idx ON auth_refresh_tokens (user_id);
CREATE INDEX auth_refresh_tokens_expires_idx ON auth_refresh_tokens (expires_at);

-- +goose Down
DROP TABLE auth_refresh_tokens;
