-- +goose Up
-- Allocations (docs/allocations.md): a tenant's GPUs by SKU, their reserved GPUs and
-- their status history. Node and catalog rows are referred to by id only: features talk
-- through Go interfaces, not through each other's tables.
CREATE TABLE allocations (
    id                uuid PRIMARY KEY,
    tenant_id         uuid NOT NULL,
    project_id        uuid NOT NULL,
    owner_user_id     uuid NOT NULL,
    name              text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 120),
    sku               text NOT NULL CHECK (char_length(sku) BETWEEN 1 AND 64),
    gpu_model         text NOT NULL CHECK (char_length(gpu_model) BETWEEN 1 AND 128),
    gpu_count         integer NOT NULL CHECK (gpu_count BETWEEN 1 AND 16),
    usage_unit        text NOT NULL CHECK (char_length(usage_unit) BETWEEN 1 AND 64),
    region_code       text NOT NULL CHECK (char_length(region_code) BETWEEN 1 AND 64),
    node_id           uuid NOT NULL,
    os_image_id       uuid,
    ssh_key_ids       uuid[] NOT NULL,
    -- Public keys as resolved at create time: the provisioning task carries them, and a
    -- key deleted later does not change what was launched. Public keys are not secrets.
    ssh_public_keys   text[] NOT NULL,
    status            text NOT NULL CHECK (status IN ('requested', 'provisioning', 'active', 'idle', 'stopped',
                          'completed', 'restarting', 'restart_failed', 'releasing', 'released', 'failed',
                          'release_failed')),
    status_reason     text CHECK (char_length(status_reason) <= 1024),
    -- Hourly rate at launch in the tenant's currency (display only; billing rates usage).
    hourly_rate_minor bigint,
    currency          text CHECK (currency ~ '^[A-Z]{3}$'),
    connection_host   text CHECK (char_length(connection_host) <= 255),
    connection_port   integer CHECK (connection_port BETWEEN 1 AND 65535),
    connection_user   text CHECK (char_length(connection_user) <= 64),
    -- Set by an admin force-release: nothing confirmed that the node is clean.
    node_cleanup      boolean NOT NULL DEFAULT false,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    active_at         timestamptz,
    ended_at          timestamptz
);

CREATE INDEX allocations_project_idx ON allocations (project_id, id);
CREATE INDEX allocations_tenant_idx ON allocations (tenant_id, id);
-- Live allocations (not released, failed or completed): concurrency limit, SKU usage.
CREATE INDEX allocations_live_project_idx ON allocations (project_id)
    WHERE status NOT IN ('released', 'failed', 'completed');
CREATE INDEX allocations_live_sku_idx ON allocations (sku)
    WHERE status NOT IN ('released', 'failed', 'completed');

-- The GPUs an allocation holds. released_at is set when the allocation enters a status
-- that frees its GPUs (lifecycle.HoldsGPUs); the partial unique index is the database's
-- guarantee that no GPU is ever held by two live allocations.
CREATE TABLE allocation_gpus (
    allocation_id uuid NOT NULL REFERENCES allocations (id) ON DELETE CASCADE,
    node_id       uuid NOT NULL,
    gpu_uuid      text NOT NULL CHECK (char_length(gpu_uuid) BETWEEN 1 AND 128),
    gpu_index     integer NOT NULL CHECK (gpu_index BETWEEN 0 AND 1023),
    reserved_at   timestamptz NOT NULL,
    released_at   timestamptz,
    PRIMARY KEY (allocation_id, gpu_uuid)
);

CREATE UNIQUE INDEX allocation_gpus_held_key ON allocation_gpus (node_id, gpu_uuid) WHERE released_at IS NULL;

-- Every status transition, with its reason, actor and correlation id.
CREATE TABLE allocation_events (
    id             uuid PRIMARY KEY,
    allocation_id  uuid NOT NULL REFERENCES allocations (id) ON DELETE CASCADE,
    from_status    text,
    to_status      text NOT NULL,
    event          text NOT NULL CHECK (char_length(event) BETWEEN 1 AND 64),
    reason         text CHECK (char_length(reason) <= 1024),
    actor_type     text NOT NULL CHECK (actor_type IN ('user', 'admin', 'node', 'system')),
    actor_id       text CHECK (char_length(actor_id) <= 128),
    correlation_id text CHECK (char_length(correlation_id) <= 128),
    created_at     timestamptz NOT NULL
);

CREATE INDEX allocation_events_allocation_idx ON allocation_events (allocation_id, id);

-- +goose Down
DROP TABLE allocation_events;
DROP TABLE allocation_gpus;
DROP TABLE allocations;
