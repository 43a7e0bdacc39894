-- +goose Up
-- Bare-metal lifecycle through Canonical MAAS (controlplane/internal/maas, docs/maas.md).

-- A MAAS region controller. Its API keys live in maas_credentials.
CREATE TABLE maas_sites (
    id                  uuid PRIMARY KEY,
    name                text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,63}$'),
    region              text NOT NULL CHECK (region ~ '^[a-z0-9][a-z0-9-]{0,63}$'),
    api_url             text NOT NULL CHECK (char_length(api_url) BETWEEN 1 AND 2048),
    tls_verify          boolean NOT NULL DEFAULT true,
    ca_bundle           text CHECK (char_length(ca_bundle) <= 65536),
    default_os_image_id uuid,
    default_pool        text CHECK (char_length(default_pool) <= 256),
    default_zone        text CHECK (char_length(default_zone) <= 256),
    default_tags        text[] NOT NULL DEFAULT '{}',
    check_status        text CHECK (check_status IN ('ok', 'unreachable', 'tls_invalid', 'credentials_invalid', 'upstream_error')),
    check_reason        text CHECK (char_length(check_reason) <= 512),
    checked_at          timestamptz,
    last_sync_at        timestamptz,
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL,
    CONSTRAINT maas_sites_name_key UNIQUE (name)
);

-- API keys of a site, sealed (AES-GCM) under a key derived from the master key with the
-- credential id as additional data. At most one active and one pending per site: a
-- rotated-in key stays pending (the active one keeps working) until it has worked once.
CREATE TABLE maas_credentials (
    id          uuid PRIMARY KEY,
    site_id     uuid NOT NULL REFERENCES maas_sites (id) ON DELETE CASCADE,
    key_sealed  bytea NOT NULL,
    state       text NOT NULL CHECK (state IN ('pending', 'active', 'retired')),
    created_at  timestamptz NOT NULL,
    verified_at timestamptz,
    retired_at  timestamptz
);
CREATE UNIQUE INDEX maas_credentials_one_active ON maas_credentials (site_id) WHERE state = 'active';
CREATE UNIQUE INDEX maas_credentials_one_pending ON maas_credentials (site_id) WHERE state = 'pending';

-- Machines as the last sync saw them.
CREATE TABLE maas_machines (
    site_id     uuid NOT NULL REFERENCES maas_sites (id) ON DELETE CASCADE,
    system_id   text NOT NULL CHECK (char_length(system_id) BETWEEN 1 AND 64),
    hostname    text NOT NULL CHECK (char_length(hostname) <= 253),
    status      integer NOT NULL,
    status_name text NOT NULL CHECK (char_length(status_name) <= 64),
    power_state text NOT NULL CHECK (char_length(power_state) <= 32),
    pool        text NOT NULL CHECK (char_length(pool) <= 256),
    zone        text NOT NULL CHECK (char_length(zone) <= 256),
    tags        text[] NOT NULL DEFAULT '{}',
    cpu_count   integer NOT NULL,
    memory_mib  bigint NOT NULL,
    -- [{"model": "...", "count": n}] from the commissioning hardware inventory.
    gpus        jsonb NOT NULL DEFAULT '[]',
    ip_address  text CHECK (char_length(ip_address) <= 64),
    synced_at   timestamptz NOT NULL,
    PRIMARY KEY (site_id, system_id)
);

-- Onboarding recipes.
CREATE TABLE maas_profiles (
    id             uuid PRIMARY KEY,
    name           text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,63}$'),
    os_image_id    uuid NOT NULL,
    osystem        text NOT NULL CHECK (char_length(osystem) BETWEEN 1 AND 32),
    distro_series  text NOT NULL CHECK (char_length(distro_series) BETWEEN 1 AND 32),
    hwe_kernel     text CHECK (char_length(hwe_kernel) <= 64),
    storage_layout text NOT NULL CHECK (storage_layout IN ('flat', 'lvm', 'bcache')),
    agent_runtime  text NOT NULL CHECK (agent_runtime IN ('linux-user')),
    labels         text[] NOT NULL DEFAULT '{}',
    region         text CHECK (region ~ '^[a-z0-9][a-z0-9-]{0,63}$'),
    skus           text[] NOT NULL,
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    CONSTRAINT maas_profiles_name_key UNIQUE (name)
);

-- The onboarding and decommission workflows (maas/workflow.go). `steps` is the visible
-- history: [{name, state, attempts, started_at, finished_at, deadline_at, reason}]. The
-- River job that runs the current step is inserted in the transaction that sets it.
CREATE TABLE maas_onboardings (
    id              uuid PRIMARY KEY,
    site_id         uuid NOT NULL REFERENCES maas_sites (id),
    profile_id      uuid NOT NULL REFERENCES maas_profiles (id),
    -- The profile as it was when the onboarding started.
    recipe          jsonb NOT NULL,
    system_id       text CHECK (char_length(system_id) BETWEEN 1 AND 64),
    constraints     jsonb,
    node_name       text,
    hostname        text CHECK (char_length(hostname) <= 253),
    node_id         uuid,
    -- The one-time enrollment token, sealed, until the deploy step has used it.
    enrollment_sealed bytea,
    state           text NOT NULL CHECK (state IN ('pending', 'running', 'succeeded', 'failed', 'aborting', 'aborted')),
    current_step    text,
    failure_reason  text CHECK (char_length(failure_reason) <= 1024),
    steps           jsonb NOT NULL DEFAULT '[]',
    created_by      uuid,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    finished_at     timestamptz
);
-- Of concurrent onboardings of one machine exactly one is accepted.
CREATE UNIQUE INDEX maas_onboardings_one_per_machine ON maas_onboardings (site_id, system_id)
    WHERE state IN ('pending', 'running', 'failed', 'aborting');

CREATE TABLE maas_decommissions (
    id             uuid PRIMARY KEY,
    node_id        uuid NOT NULL,
    node_name      text NOT NULL,
    site_id        uuid REFERENCES maas_sites (id),
    system_id      text,
    drain_deadline timestamptz,
    erase          text NOT NULL CHECK (erase IN ('quick', 'secure')),
    reason         text CHECK (char_length(reason) <= 512),
    state          text NOT NULL CHECK (state IN ('pending', 'running', 'succeeded', 'failed', 'aborting', 'aborted')),
    current_step   text,
    failure_reason text CHECK (char_length(failure_reason) <= 1024),
    steps          jsonb NOT NULL DEFAULT '[]',
    created_by     uuid,
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    finished_at    timestamptz
);
CREATE UNIQUE INDEX maas_decommissions_one_per_node ON maas_decommissions (node_id)
    WHERE state IN ('pending', 'running', 'failed', 'aborting');

-- +goose Down
DROP TABLE maas_decommissions;
DROP TABLE maas_onboardings;
DROP TABLE maas_profiles;
DROP TABLE maas_machines;
DROP TABLE maas_credentials;
DROP TABLE maas_sites;
