-- Signing keys of the access-token JWTs (auth). Exactly one key is active (it signs);
-- retired keys stay published in the JWKS until expires_at, so tokens they signed keep
-- verifying for the rest of their lifetime. The private key is stored only encrypted:
-- AES-256-GCM under the master key (GANTRY_MASTER_KEY), nonce || ciphertext, with the
-- kid as additional data so a ciphertext cannot be moved to another row.

-- +goose Up
CREATE TABLE auth_signing_keys (
    kid             uuid PRIMARY KEY,
    algorithm       text NOT NULL CHECK (algorithm = 'RS256'),
    -- The public half as a JWK (kty, n, e, kid, alg, use); never holds private members.
    public_jwk      jsonb NOT NULL CHECK (NOT (public_jwk ? 'd')),
    private_key_enc bytea NOT NULL,
    state           text NOT NULL CHECK (state IN ('active', 'retired')),
    created_at      timestamptz NOT NULL,
    retired_at      timestamptz,
    -- When the key leaves the JWKS; NULL while it is active.
    expires_at      timestamptz,
    CHECK ((state = 'active') = (retired_at IS NULL)),
    CHECK ((state = 'active') = (expires_at IS NULL))
);
CREATE UNIQUE INDEX auth_signing_keys_one_active ON auth_signing_keys ((true)) WHERE state = 'active';
CREATE INDEX auth_signing_keys_expires_idx ON auth_signing_keys (expires_at);

-- +goose Down
DROP TABLE auth_signing_keys;
