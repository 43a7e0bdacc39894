-- +goose Up
-- The app catalog (docs/apps.md): apps by slug, their immutable versions (how each runs
-- on a node), and which tenants may launch them.
CREATE TABLE apps (
    slug        text PRIMARY KEY CHECK (slug ~ '^[a-z0-9][a-z0-9-]{1,62}$'),
    name        text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 120),
    description text NOT NULL DEFAULT '' CHECK (char_length(description) <= 2000),
    kind        text NOT NULL CHECK (kind IN ('compute', 'jupyter', 'vllm', 'training', 'scheduler', 'kubernetes', 'app')),
    deprecated_at timestamptz,
    created_by  uuid,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);

-- A version never changes once created (deprecate it and add another): a running
-- instance keeps the spec it was launched with either way.
CREATE TABLE app_versions (
    app_slug      text NOT NULL REFERENCES apps (slug) ON DELETE CASCADE,
    version       text NOT NULL CHECK (char_length(version) BETWEEN 1 AND 64),
    -- Creation order within the app (versions are listed oldest first; "latest" is the
    -- newest one not deprecated).
    seq           bigint GENERATED ALWAYS AS IDENTITY,
    command       text[] NOT NULL CHECK (cardinality(command) BETWEEN 1 AND 64),
    -- [{"name": ..., "value": ...}], names unique.
    env           jsonb NOT NULL DEFAULT '[]',
    port          integer NOT NULL CHECK (port BETWEEN 1024 AND 65535),
    health_type   text NOT NULL CHECK (health_type IN ('http', 'tcp')),
    health_path   text CHECK (char_length(health_path) BETWEEN 1 AND 256),
    health_interval_seconds integer NOT NULL CHECK (health_interval_seconds BETWEEN 1 AND 300),
    health_timeout_seconds  integer NOT NULL CHECK (health_timeout_seconds BETWEEN 1 AND 60),
    health_failure_threshold integer NOT NULL CHECK (health_failure_threshold BETWEEN 1 AND 20),
    startup_timeout_seconds integer NOT NULL CHECK (startup_timeout_seconds BETWEEN 5 AND 3600),
    min_gpu_count integer NOT NULL DEFAULT 0 CHECK (min_gpu_count BETWEEN 0 AND 16),
    gpu_model     text CHECK (char_length(gpu_model) BETWEEN 1 AND 128),
    placement     text NOT NULL CHECK (placement IN ('instance', 'whole_allocation')),
    bootstrap_ssh boolean NOT NULL DEFAULT false,
    deprecated_at timestamptz,
    created_by    uuid,
    created_at    timestamptz NOT NULL,
    PRIMARY KEY (app_slug, version),
    CHECK ((health_type = 'http') = (health_path IS NOT NULL))
);

CREATE INDEX app_versions_order_idx ON app_versions (app_slug, seq);

-- tenant_id NULL entitles every tenant. One row per (app, tenant or all).
CREATE TABLE app_entitlements (
    id         uuid PRIMARY KEY,
    app_slug   text NOT NULL REFERENCES apps (slug) ON DELETE CASCADE,
    tenant_id  uuid REFERENCES tenants (id) ON DELETE CASCADE,
    created_by uuid,
    created_at timestamptz NOT NULL,
    CONSTRAINT app_entitlements_app_tenant_key UNIQUE NULLS NOT DISTINCT (app_slug, tenant_id)
);

CREATE INDEX app_entitlements_tenant_idx ON app_entitlements (tenant_id);

-- Artifacts (docs/apps.md, Artifacts): a named, versioned file set of a project. Each
-- file's bytes live in the blob store under blob_key with their SHA-256, checked again
-- on every read.
CREATE TABLE app_artifacts (
    id          uuid PRIMARY KEY,
    tenant_id   uuid NOT NULL,
    project_id  uuid NOT NULL,
    name        text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,119}$'),
    version     text NOT NULL CHECK (char_length(version) BETWEEN 1 AND 64),
    kind        text NOT NULL CHECK (kind IN ('notebook', 'model', 'config', 'dataset', 'other')),
    description text NOT NULL DEFAULT '' CHECK (char_length(description) <= 2000),
    created_by  uuid NOT NULL,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    CONSTRAINT app_artifacts_project_name_version_key UNIQUE (project_id, name, version)
);

CREATE TABLE app_artifact_files (
    artifact_id uuid NOT NULL REFERENCES app_artifacts (id) ON DELETE CASCADE,
    path        text NOT NULL CHECK (octet_length(path) BETWEEN 1 AND 1024),
    size_bytes  bigint NOT NULL CHECK (size_bytes >= 0),
    sha256      text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    blob_key    text NOT NULL UNIQUE CHECK (char_length(blob_key) BETWEEN 1 AND 512),
    created_at  timestamptz NOT NULL,
    PRIMARY KEY (artifact_id, path)
);

-- Shared runtimes (docs/apps.md, Shared runtimes): one app version served by app
-- instances (workers) on allocations of the owner project, used by attached projects
-- that pay per unit.
CREATE TABLE shared_runtimes (
    id               uuid PRIMARY KEY,
    name             text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 120),
    app_slug         text NOT NULL REFERENCES apps (slug),
    app_version      text NOT NULL,
    owner_kind       text NOT NULL CHECK (owner_kind IN ('platform', 'tenant')),
    owner_tenant_id  uuid NOT NULL,
    owner_project_id uuid NOT NULL,
    usage_unit       text NOT NULL CHECK (usage_unit IN ('request')),
    unit_price_minor bigint NOT NULL CHECK (unit_price_minor >= 0),
    currency         text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    created_by       uuid NOT NULL,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    FOREIGN KEY (app_slug, app_version) REFERENCES app_versions (app_slug, version)
);

CREATE TABLE shared_runtime_workers (
    id                uuid PRIMARY KEY,
    shared_runtime_id uuid NOT NULL REFERENCES shared_runtimes (id) ON DELETE CASCADE,
    allocation_id     uuid NOT NULL,
    app_instance_id   uuid,
    node_id           uuid,
    state             text NOT NULL CHECK (state IN ('starting', 'running', 'unhealthy', 'draining', 'stopped', 'failed')),
    state_reason      text CHECK (char_length(state_reason) <= 1024),
    last_report_at    timestamptz,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL
);

CREATE INDEX shared_runtime_workers_runtime_idx ON shared_runtime_workers (shared_runtime_id, id);
CREATE UNIQUE INDEX shared_runtime_workers_instance_key ON shared_runtime_workers (app_instance_id) WHERE app_instance_id IS NOT NULL;

CREATE TABLE shared_runtime_attachments (
    id                uuid PRIMARY KEY,
    shared_runtime_id uuid NOT NULL REFERENCES shared_runtimes (id) ON DELETE CASCADE,
    tenant_id         uuid NOT NULL,
    project_id        uuid NOT NULL,
    created_by        uuid NOT NULL,
    created_at        timestamptz NOT NULL,
    CONSTRAINT shared_runtime_attachments_project_key UNIQUE (shared_runtime_id, project_id)
);

CREATE INDEX shared_runtime_attachments_project_idx ON shared_runtime_attachments (project_id);

CREATE TABLE shared_runtime_worker_operations (
    id                uuid PRIMARY KEY,
    shared_runtime_id uuid NOT NULL REFERENCES shared_runtimes (id) ON DELETE CASCADE,
    worker_id         uuid NOT NULL REFERENCES shared_runtime_workers (id) ON DELETE CASCADE,
    kind              text NOT NULL CHECK (kind IN ('restart', 'drain')),
    state             text NOT NULL CHECK (state IN ('pending', 'running', 'succeeded', 'failed')),
    state_reason      text CHECK (char_length(state_reason) <= 1024),
    requested_by      uuid NOT NULL,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    finished_at       timestamptz
);

-- One operation in flight per worker.
CREATE UNIQUE INDEX shared_runtime_worker_operations_live_key ON shared_runtime_worker_operations (worker_id)
    WHERE state IN ('pending', 'running');
CREATE INDEX shared_runtime_worker_operations_worker_idx ON shared_runtime_worker_operations (worker_id, id);

CREATE TABLE shared_runtime_repair_operations (
    id                uuid PRIMARY KEY,
    shared_runtime_id uuid NOT NULL REFERENCES shared_runtimes (id) ON DELETE CASCADE,
    kind              text NOT NULL CHECK (kind IN ('restart_unhealthy_workers', 'replace_failed_workers')),
    state             text NOT NULL CHECK (state IN ('pending', 'running', 'succeeded', 'failed')),
    state_reason      text CHECK (char_length(state_reason) <= 1024),
    worker_ids        uuid[] NOT NULL DEFAULT '{}',
    requested_by      uuid NOT NULL,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    finished_at       timestamptz
);

-- One repair in flight per runtime.
CREATE UNIQUE INDEX shared_runtime_repair_operations_live_key ON shared_runtime_repair_operations (shared_runtime_id)
    WHERE state IN ('pending', 'running');
CREATE INDEX shared_runtime_repair_operations_runtime_idx ON shared_runtime_repair_operations (shared_runtime_id, id);

-- Metered calls through the app proxy by attached projects: one row per unit (call),
-- keyed by the call id the proxy mints, so a unit is counted (and rated) once however
-- often it is reported. rated_txn is the ledger transaction that billed it.
CREATE TABLE shared_runtime_usage (
    call_id           uuid PRIMARY KEY,
    shared_runtime_id uuid NOT NULL REFERENCES shared_runtimes (id) ON DELETE CASCADE,
    attachment_id     uuid NOT NULL,
    tenant_id         uuid NOT NULL,
    project_id        uuid NOT NULL,
    user_id           uuid NOT NULL,
    occurred_at       timestamptz NOT NULL,
    usage_record_id   uuid
);

CREATE INDEX shared_runtime_usage_unrated_idx ON shared_runtime_usage (occurred_at) WHERE usage_record_id IS NULL;

-- +goose Down
DROP TABLE shared_runtime_usage;
DROP TABLE shared_runtime_repair_operations;
DROP TABLE shared_runtime_worker_operations;
DROP TABLE shared_runtime_attachments;
DROP TABLE shared_runtime_workers;
DROP TABLE shared_runtimes;
DROP TABLE app_artifact_files;
DROP TABLE app_artifacts;
DROP TABLE app_entitlements;
DROP TABLE app_versions;
DROP TABLE apps;
