-- Machine identities (issue 19 item 5): service accounts and project access credentials,
-- and the client credentials (client id + hashed secret) that get short-lived access
-- tokens from the client-credentials grant (POST /api/v1/auth/token).
--
-- Every machine identity acts as a users row of its own (password_hash NULL, tenant_id
-- NULL so it is nobody's tenant user and can never sign in with a password or appear in
-- the tenant's user list): allocations, SSH keys and audit rows name their actor by
-- user id, and a machine's work needs an owner the same way a person's does. Its tenant,
-- projects and roles live here and travel in its access token (auth/machine.go).

-- +goose Up
CREATE TABLE service_accounts (
    id          uuid PRIMARY KEY,
    tenant_id   uuid NOT NULL REFERENCES tenants (id),
    user_id     uuid NOT NULL UNIQUE REFERENCES users (id),
    name        text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 120),
    description text NOT NULL DEFAULT '' CHECK (char_length(description) <= 500),
    created_by  uuid REFERENCES users (id),
    created_at  timestamptz NOT NULL,
    deleted_at  timestamptz
);
CREATE UNIQUE INDEX service_accounts_live_name ON service_accounts (tenant_id, name) WHERE deleted_at IS NULL;
CREATE INDEX service_accounts_tenant_idx ON service_accounts (tenant_id, id) WHERE deleted_at IS NULL;

-- A service account's role in each project it may act in (never owner).
CREATE TABLE service_account_project_roles (
    service_account_id uuid NOT NULL REFERENCES service_accounts (id) ON DELETE CASCADE,
    project_id         uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    role               text NOT NULL CHECK (role IN ('admin', 'member', 'viewer')),
    created_at         timestamptz NOT NULL,
    PRIMARY KEY (service_account_id, project_id)
);

CREATE TABLE access_credentials (
    id                 uuid PRIMARY KEY,
    tenant_id          uuid NOT NULL REFERENCES tenants (id),
    kind               text NOT NULL CHECK (kind IN ('service_account', 'project')),
    service_account_id uuid REFERENCES service_accounts (id),
    project_id         uuid REFERENCES projects (id),
    project_role       text CHECK (project_role IN ('admin', 'member', 'viewer')),
    -- The users row the credential's tokens act as: the service account's, or one of the
    -- project credential's own.
    user_id            uuid NOT NULL REFERENCES users (id),
    name               text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 120),
    client_id          text NOT NULL UNIQUE,
    -- SHA-256 of the secret: the secret is 32 random bytes, so a slow hash adds nothing.
    secret_hash        bytea NOT NULL CHECK (octet_length(secret_hash) = 32),
    expires_at         timestamptz,
    last_used_at       timestamptz,
    created_by         uuid REFERENCES users (id),
    created_at         timestamptz NOT NULL,
    revoked_at         timestamptz,
    revoked_by         uuid REFERENCES users (id),
    CHECK ((kind = 'service_account') = (service_account_id IS NOT NULL)),
    CHECK ((kind = 'project') = (project_id IS NOT NULL)),
    CHECK ((project_id IS NULL) = (project_role IS NULL))
);
CREATE INDEX access_credentials_tenant_idx ON access_credentials (tenant_id, id);
CREATE INDEX access_credentials_project_idx ON access_credentials (project_id, id) WHERE project_id IS NOT NULL;
CREATE INDEX access_credentials_sa_idx ON access_credentials (service_account_id) WHERE service_account_id IS NOT NULL;

-- +goose Down
DROP TABLE access_credentials;
DROP TABLE service_account_project_roles;
DROP TABLE service_accounts;
