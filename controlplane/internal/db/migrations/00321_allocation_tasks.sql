-- +goose Up
-- Tasks sent to a node's agent on behalf of an allocation (allocation.provision,
-- allocation.release). The task id is what the agent dedupes on and what its report
-- names; this table maps a report back to its allocation and kind.
CREATE TABLE allocation_tasks (
    task_id       uuid PRIMARY KEY,
    allocation_id uuid NOT NULL REFERENCES allocations (id) ON DELETE CASCADE,
    node_id       uuid NOT NULL,
    kind          text NOT NULL CHECK (kind IN ('allocation.provision', 'allocation.release')),
    created_at    timestamptz NOT NULL,
    acked_at      timestamptz,
    finished_at   timestamptz
);

CREATE INDEX allocation_tasks_allocation_idx ON allocation_tasks (allocation_id);

-- +goose Down
DROP TABLE allocation_tasks;
