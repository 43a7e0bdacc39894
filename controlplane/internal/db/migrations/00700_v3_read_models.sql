-- +goose Up
-- v3 read models (docs/operations.md; issue 21).

-- A user's dismissal of one attention item: the condition of a workload that began at
-- condition_since (the key names all three, so a later failure is a new item). The
-- dismissal is that user's only; nobody else's attention changes.
CREATE TABLE v3_attention_dismissals (
    user_id         uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    attention_key   text NOT NULL CHECK (attention_key ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,179}$'),
    allocation_id   uuid NOT NULL REFERENCES allocations (id) ON DELETE CASCADE,
    condition       text NOT NULL CHECK (condition IN ('release_failed', 'restart_failed', 'failed')),
    condition_since timestamptz NOT NULL,
    dismissed_at    timestamptz NOT NULL,
    PRIMARY KEY (user_id, attention_key)
);
CREATE INDEX v3_attention_dismissals_allocation_idx ON v3_attention_dismissals (allocation_id, user_id);

-- The read marker of a user's notifications: what happened up to read_through is read.
CREATE TABLE notification_read_markers (
    user_id      uuid PRIMARY KEY REFERENCES users (id) ON DELETE CASCADE,
    read_through timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL
);

-- The workloads list pages a project's allocations newest first (or by name); without
-- these a 10,000-workload project sorts on every first page.
CREATE INDEX allocations_project_created_idx ON allocations (project_id, created_at DESC, id DESC);
CREATE INDEX allocations_project_name_idx ON allocations (project_id, name, id);
-- Unread notifications count a project's allocation events after a marker.
CREATE INDEX allocation_events_created_idx ON allocation_events (allocation_id, created_at);

-- +goose Down
DROP INDEX allocation_events_created_idx;
DROP INDEX allocations_project_name_idx;
DROP INDEX allocations_project_created_idx;
DROP TABLE notification_read_markers;
DROP TABLE v3_attention_dismissals;
