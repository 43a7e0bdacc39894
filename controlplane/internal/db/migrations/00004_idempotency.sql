-- Idempotency keys of create operations. A row is written in the same transaction as the
-- mutation it guards, so a key exists if and only if its mutation committed.

-- +goose Up
CREATE TABLE idempotency_keys (
    principal        text NOT NULL,
    method           text NOT NULL,
    route            text NOT NULL,
    idempotency_key  text NOT NULL CHECK (char_length(idempotency_key) BETWEEN 1 AND 128),
    request_hash     bytea NOT NULL,
    status_code      integer NOT NULL,
    -- Only sanitized JSON is kept; empty and non-JSON bodies are never persisted.
    response_body    bytea,
    created_at       timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (principal, method, route, idempotency_key)
);
CREATE INDEX idempotency_keys_expiry_idx ON idempotency_keys (expires_at);

-- +goose Down
DROP TABLE idempotency_keys;
