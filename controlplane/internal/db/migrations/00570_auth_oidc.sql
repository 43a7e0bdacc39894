-- Enterprise sign-in through OIDC federation (docs/api.md, "Enterprise sign-in (OIDC)").
--
-- tenant_identity_providers: at most one OpenID provider per tenant. The client secret is
-- sealed with AES-256-GCM under the master key (additional data binds it to the
-- tenant) and never returned. role_mapping maps a value of role_claim (e.g. a group)
-- to a tenant role; a user matching none gets 'member'. password_sign_in = false
-- refuses password sign-in of the tenant's password users (auth_personal_disabled).
--
-- auth_oidc_flows: one row per started sign-in, keyed by the SHA-256 of its state, bound
-- to the SHA-256 of the browser's flow cookie; deleted when the callback uses it (single
-- use) and useless after expires_at (10 minutes).
--
-- auth_federated_identities: the (issuer, subject) a federated user was provisioned
-- from. Such a user has no password: a password sign-in is auth_enterprise_required.

-- +goose Up
CREATE TABLE tenant_identity_providers (
    tenant_id         uuid PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    issuer            text NOT NULL,
    client_id         text NOT NULL,
    client_secret_enc bytea NOT NULL,
    redirect_url      text NOT NULL,
    allowed_domains   text[] NOT NULL,
    role_claim        text NOT NULL DEFAULT 'groups',
    role_mapping      jsonb NOT NULL DEFAULT '{}',
    password_sign_in  boolean NOT NULL DEFAULT false,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL
);

CREATE TABLE auth_oidc_flows (
    state_hash    bytea PRIMARY KEY CHECK (octet_length(state_hash) = 32),
    cookie_hash   bytea NOT NULL CHECK (octet_length(cookie_hash) = 32),
    tenant_id     uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    nonce         text NOT NULL,
    pkce_verifier text NOT NULL,
    created_at    timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL
);
CREATE INDEX auth_oidc_flows_expires_idx ON auth_oidc_flows (expires_at);

CREATE TABLE auth_federated_identities (
    user_id    uuid PRIMARY KEY REFERENCES users (id) ON DELETE CASCADE,
    tenant_id  uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    issuer     text NOT NULL,
    subject    text NOT NULL,
    created_at timestamptz NOT NULL,
    UNIQUE (issuer, subject)
);

-- +goose Down
DROP TABLE auth_federated_identities;
DROP TABLE auth_oidc_flows;
DROP TABLE tenant_identity_providers;
