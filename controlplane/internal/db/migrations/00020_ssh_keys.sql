-- SSH public keys per user (seed §1: an allocation create needs a resolvable key).
-- public_key holds the normalised key (algorithm + base64 blob); options and comments
-- of the submitted authorized_keys line are never stored in it.

-- +goose Up
CREATE TABLE ssh_keys (
    id          uuid PRIMARY KEY,
    user_id     uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    name        text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 120),
    key_type    text NOT NULL CHECK (char_length(key_type) BETWEEN 1 AND 64),
    public_key  text NOT NULL CHECK (char_length(public_key) BETWEEN 1 AND 16384),
    comment     text CHECK (char_length(comment) <= 1024),
    fingerprint text NOT NULL CHECK (fingerprint LIKE 'SHA256:%'),
    bits        integer NOT NULL CHECK (bits > 0),
    created_at  timestamptz NOT NULL,
    -- One key per fingerprint per user; also the index Resolve and List use (user_id first).
    CONSTRAINT ssh_keys_user_fingerprint_key UNIQUE (user_id, fingerprint)
);
CREATE INDEX ssh_keys_user_idx ON ssh_keys (user_id, id);

-- +goose Down
DROP TABLE ssh_keys;
