-- +goose Up
-- Allocation groups (docs/allocations.md): N allocations of one SKU launched together in
-- one region, all placed or none, released together. A member is an ordinary allocation
-- that names its group.
CREATE TABLE allocation_groups (
    id            uuid PRIMARY KEY,
    tenant_id     uuid NOT NULL,
    project_id    uuid NOT NULL,
    owner_user_id uuid NOT NULL,
    name          text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 100),
    sku           text NOT NULL CHECK (char_length(sku) BETWEEN 1 AND 64),
    member_count  integer NOT NULL CHECK (member_count BETWEEN 1 AND 64),
    region_code   text NOT NULL CHECK (char_length(region_code) BETWEEN 1 AND 64),
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL
);
CREATE INDEX allocation_groups_project_idx ON allocation_groups (project_id, id);

ALTER TABLE allocations ADD COLUMN group_id uuid REFERENCES allocation_groups (id);
CREATE INDEX allocations_group_idx ON allocations (group_id, id) WHERE group_id IS NOT NULL;

-- Idle detection: when the evaluator first saw every GPU of an active allocation under
-- the idle threshold (NULL: not under it, or not observed). Kept in the row, not in
-- memory, so a restart or another replica continues the same observation; it is
-- set and cleared with compare-and-set updates, and reset by every status change.
ALTER TABLE allocations ADD COLUMN under_threshold_since timestamptz;
CREATE INDEX allocations_running_idx ON allocations (id) WHERE status IN ('active', 'idle');
-- Stop consumers: the running allocations of a tenant (runway) or project (budget).
CREATE INDEX allocations_tenant_running_idx ON allocations (tenant_id)
    WHERE status IN ('requested', 'provisioning', 'active', 'idle', 'restarting', 'restart_failed');

-- Stop requests applied (budget.suspend_requested, billing.runway_exhausted), one row
-- per event: a redelivered event that was applied already changes nothing.
CREATE TABLE allocation_stop_requests (
    event_id    uuid PRIMARY KEY,
    event_type  text NOT NULL CHECK (char_length(event_type) BETWEEN 1 AND 64),
    tenant_id   uuid NOT NULL,
    project_id  uuid,
    reason      text NOT NULL CHECK (char_length(reason) <= 1024),
    stopped     integer NOT NULL DEFAULT 0,
    released    integer NOT NULL DEFAULT 0,
    applied_at  timestamptz NOT NULL
);

-- accrued_cost reads every usage record of an allocation (open and closed runs); the
-- billing table only indexes the open run per source.
CREATE INDEX billing_usage_records_source_idx ON billing_usage_records (source, source_id);

-- +goose Down
DROP INDEX billing_usage_records_source_idx;
DROP TABLE allocation_stop_requests;
DROP INDEX allocations_tenant_running_idx;
DROP INDEX allocations_running_idx;
ALTER TABLE allocations DROP COLUMN under_threshold_since;
DROP INDEX allocations_group_idx;
ALTER TABLE allocations DROP COLUMN group_id;
DROP TABLE allocation_groups;
