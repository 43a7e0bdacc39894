-- The node fabric's PKI (controlplane/internal/fabric): one CA that agents trust (handed
-- out at enrollment), and the server certificates it issued for the fabric listener.
-- Every replica serves the same certificate, so the rows are shared. Private keys are
-- stored only encrypted: AES-256-GCM under a key derived from the master key
-- (GANTRY_MASTER_KEY, purpose "gantry/fabric-pki"), nonce || ciphertext, with the row id
-- as additional data so a ciphertext cannot be moved to another row.

-- +goose Up
CREATE TABLE fabric_ca (
    id          uuid PRIMARY KEY,
    -- Exactly one CA; a second INSERT from a racing replica conflicts on this.
    singleton   boolean NOT NULL DEFAULT true UNIQUE CHECK (singleton),
    cert_pem    text NOT NULL CHECK (cert_pem LIKE '-----BEGIN CERTIFICATE-----%'),
    key_enc     bytea NOT NULL,
    not_after   timestamptz NOT NULL,
    created_at  timestamptz NOT NULL
);

CREATE TABLE fabric_server_certs (
    id          uuid PRIMARY KEY,
    ca_id       uuid NOT NULL REFERENCES fabric_ca (id),
    cert_pem    text NOT NULL CHECK (cert_pem LIKE '-----BEGIN CERTIFICATE-----%'),
    key_enc     bytea NOT NULL,
    -- The DNS names and IP addresses the certificate is valid for (sorted).
    names       text[] NOT NULL CHECK (cardinality(names) BETWEEN 1 AND 64),
    not_after   timestamptz NOT NULL,
    created_at  timestamptz NOT NULL
);
CREATE INDEX fabric_server_certs_created_idx ON fabric_server_certs (created_at DESC);

-- +goose Down
DROP TABLE fabric_server_certs;
DROP TABLE fabric_ca;
