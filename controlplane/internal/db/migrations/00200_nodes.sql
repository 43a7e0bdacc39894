-- GPU nodes (issue 4): the node record an admin creates, its one-time enrollment tokens,
-- its node bearer tokens (stored hashed only), its GPU inventory and the latest
-- telemetry sample per GPU. Everything a node owns is deleted with it.

-- +goose Up
CREATE TABLE nodes (
    id                    uuid PRIMARY KEY,
    name                  text NOT NULL CHECK (name ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
    -- Host name or IP literal the probe connects to (canonical spelling for IPs).
    address               text NOT NULL CHECK (char_length(address) BETWEEN 1 AND 253),
    probe_port            integer NOT NULL CHECK (probe_port BETWEEN 1 AND 65535),
    region                text CHECK (region ~ '^[a-z0-9][a-z0-9-]{0,63}$'),
    -- Scheduling state machine (nodes/schedule.go): schedulable, cordoned, draining, drained.
    schedule_state        text NOT NULL DEFAULT 'schedulable'
                          CHECK (schedule_state IN ('schedulable', 'cordoned', 'draining', 'drained')),
    -- Connectivity as last persisted by the fabric; written only when it changes.
    status                text NOT NULL DEFAULT 'pending'
                          CHECK (status IN ('pending', 'online', 'offline')),
    status_changed_at     timestamptz,
    last_seen_at          timestamptz,
    hostname              text CHECK (char_length(hostname) BETWEEN 1 AND 253),
    agent_version         text CHECK (char_length(agent_version) BETWEEN 1 AND 64),
    enrolled_at           timestamptz,
    last_probe_at         timestamptz,
    last_probe_reachable  boolean,
    last_probe_latency_us bigint CHECK (last_probe_latency_us >= 0),
    last_probe_error      text CHECK (char_length(last_probe_error) <= 64),
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL,
    CONSTRAINT nodes_name_key UNIQUE (name)
);
CREATE UNIQUE INDEX nodes_address_key ON nodes (lower(address), probe_port);

CREATE TABLE node_enrollment_tokens (
    id         uuid PRIMARY KEY,
    node_id    uuid NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    token_hash bytea NOT NULL CHECK (octet_length(token_hash) = 32),
    created_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    used_at    timestamptz,
    CONSTRAINT node_enrollment_tokens_hash_key UNIQUE (token_hash)
);
CREATE INDEX node_enrollment_tokens_node_idx ON node_enrollment_tokens (node_id);

CREATE TABLE node_tokens (
    id            uuid PRIMARY KEY,
    node_id       uuid NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    token_hash    bytea NOT NULL CHECK (octet_length(token_hash) = 32),
    created_at    timestamptz NOT NULL,
    revoked_at    timestamptz,
    revoke_reason text CHECK (revoke_reason IN ('rotated', 'revoked', 'reenrolled')),
    CHECK ((revoked_at IS NULL) = (revoke_reason IS NULL))
);
-- At most one live token per node; AuthenticateNode reads exactly this row.
CREATE UNIQUE INDEX node_tokens_live_key ON node_tokens (node_id) WHERE revoked_at IS NULL;

CREATE TABLE node_gpus (
    node_id               uuid NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    gpu_uuid              text NOT NULL CHECK (char_length(gpu_uuid) BETWEEN 1 AND 128),
    gpu_index             integer NOT NULL CHECK (gpu_index BETWEEN 0 AND 1023),
    model                 text NOT NULL CHECK (char_length(model) BETWEEN 1 AND 128),
    memory_bytes          bigint NOT NULL CHECK (memory_bytes >= 0),
    pci_bus_id            text NOT NULL CHECK (char_length(pci_bus_id) <= 64),
    mig_enabled           boolean NOT NULL,
    driver_version        text NOT NULL CHECK (char_length(driver_version) <= 64),
    cuda_version          text NOT NULL CHECK (char_length(cuda_version) <= 32),
    -- Latest telemetry sample (NULL until the first one).
    sampled_at            timestamptz,
    utilization_percent   integer CHECK (utilization_percent BETWEEN 0 AND 100),
    memory_used_bytes     bigint CHECK (memory_used_bytes >= 0),
    temperature_c         integer CHECK (temperature_c >= 0),
    power_milliwatts      bigint CHECK (power_milliwatts >= 0),
    ecc_errors_corrected  bigint CHECK (ecc_errors_corrected >= 0),
    ecc_errors_uncorrected bigint CHECK (ecc_errors_uncorrected >= 0),
    xid_errors_total      bigint NOT NULL DEFAULT 0 CHECK (xid_errors_total >= 0),
    last_xid              bigint,
    healthy               boolean,
    PRIMARY KEY (node_id, gpu_uuid)
);

-- +goose Down
DROP TABLE node_gpus;
DROP TABLE node_tokens;
DROP TABLE node_enrollment_tokens;
DROP TABLE nodes;
