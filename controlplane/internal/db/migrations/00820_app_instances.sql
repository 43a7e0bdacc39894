-- +goose Up
-- App instances (docs/apps.md): an app version running on an allocation of the
-- project. The allocation, the project and the catalog are referred to by id only: the
-- instances feature talks to allocations and the app catalog through Go interfaces.
CREATE TABLE app_instances (
    id                uuid PRIMARY KEY,
    tenant_id         uuid NOT NULL,
    project_id        uuid NOT NULL,
    owner_user_id     uuid NOT NULL,
    name              text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 120),
    app_slug          text NOT NULL CHECK (app_slug ~ '^[a-z0-9][a-z0-9-]{1,62}$'),
    app_version       text NOT NULL CHECK (char_length(app_version) BETWEEN 1 AND 64),
    app_name          text NOT NULL CHECK (char_length(app_name) <= 120),
    -- Artifacts of the project mounted read-only (at most 16).
    artifact_ids      uuid[] NOT NULL DEFAULT '{}' CHECK (cardinality(artifact_ids) <= 16),
    -- The shared runtime this instance is a worker of (apps/sharedruntimes); NULL for a
    -- project's own instance.
    shared_runtime_id uuid,
    allocation_id     uuid NOT NULL,
    -- Set when the instance was launched with a new allocation (POST with sku): the
    -- allocation is released when the instance is stopped.
    allocation_created boolean NOT NULL DEFAULT false,
    node_id           uuid NOT NULL,
    -- The port the app serves on the node's loopback; unique among the node's live
    -- instances (app_instances_node_port_key).
    port              integer NOT NULL CHECK (port BETWEEN 1 AND 65535),
    state             text NOT NULL CHECK (state IN ('requested', 'starting', 'running', 'unhealthy',
                          'stopping', 'stopped', 'failed')),
    state_reason      text CHECK (char_length(state_reason) <= 1024),
    -- How the version runs, as launched (command, args, env, health check, GPUs): a
    -- later catalog edit does not change a running instance. No secrets.
    run_spec          jsonb NOT NULL,
    bootstrap_ssh     boolean NOT NULL DEFAULT false,
    -- Telemetry of the latest controller report (not audited, seed §6.2 rule 1).
    restart_count     integer NOT NULL DEFAULT 0 CHECK (restart_count >= 0),
    report_generation bigint NOT NULL DEFAULT 0,
    last_report_at    timestamptz,
    -- Since when the instance has been live and not healthy (starting, unhealthy): the
    -- health timeout counts from here. NULL while running or final.
    not_ready_since   timestamptz,
    running_at        timestamptz,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    ended_at          timestamptz
);

CREATE INDEX app_instances_project_idx ON app_instances (project_id, id);
-- Live instances: the per-project quota, the reconcile pass, the allocation's instances.
CREATE INDEX app_instances_live_project_idx ON app_instances (project_id) WHERE state NOT IN ('stopped', 'failed');
CREATE INDEX app_instances_live_allocation_idx ON app_instances (allocation_id) WHERE state NOT IN ('stopped', 'failed');
CREATE UNIQUE INDEX app_instances_node_port_key ON app_instances (node_id, port) WHERE state NOT IN ('stopped', 'failed');

-- Tasks sent to the node's agent for an instance (app.start, app.stop,
-- app.bootstrap_ssh). The task id is what the agent dedupes on.
CREATE TABLE app_instance_tasks (
    task_id      uuid PRIMARY KEY,
    instance_id  uuid NOT NULL REFERENCES app_instances (id) ON DELETE CASCADE,
    node_id      uuid NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('app.start', 'app.stop', 'app.bootstrap_ssh')),
    -- The task's input as dispatched: app.start/app.stop in protobuf
    -- (proto/fabric/apptask), app.bootstrap_ssh in JSON.
    payload      bytea NOT NULL,
    content_type text NOT NULL,
    created_at   timestamptz NOT NULL,
    attempts     integer NOT NULL DEFAULT 0,
    last_error   text CHECK (char_length(last_error) <= 1024),
    acked_at     timestamptz,
    finished_at  timestamptz,
    -- Set with finished_at: the agent's (or the dispatcher's) verdict.
    succeeded    boolean
);

CREATE INDEX app_instance_tasks_instance_idx ON app_instance_tasks (instance_id, created_at);
CREATE INDEX app_instance_tasks_pending_idx ON app_instance_tasks (created_at) WHERE acked_at IS NULL AND finished_at IS NULL;

-- The bootstrap SSH trust an instance asks of its node (seed §6.2 rule 2): the requested
-- state and the task that carries it. A reconcile that finds the same requested state
-- with its task in flight (or done) enqueues nothing and audits nothing.
CREATE TABLE app_instance_ssh_trust (
    instance_id     uuid PRIMARY KEY REFERENCES app_instances (id) ON DELETE CASCADE,
    requested_state text NOT NULL CHECK (requested_state IN ('trusted', 'revoked')),
    -- SHA256 fingerprints of the public keys to trust, sorted.
    fingerprints    text[] NOT NULL,
    task_id         uuid NOT NULL,
    updated_at      timestamptz NOT NULL
);

-- +goose Down
DROP TABLE app_instance_ssh_trust;
DROP TABLE app_instance_tasks;
DROP TABLE app_instances;
