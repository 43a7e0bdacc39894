-- +goose Up
-- Stop and restart are tasks too (shared/alloctask): the agent stops the workload's
-- processes when billing suspends an allocation, and restarts them on request.
ALTER TABLE allocation_tasks DROP CONSTRAINT allocation_tasks_kind_check;
ALTER TABLE allocation_tasks ADD CONSTRAINT allocation_tasks_kind_check
    CHECK (kind IN ('allocation.provision', 'allocation.release', 'allocation.stop', 'allocation.restart'));
-- The dispatcher's bookkeeping: how many delivery attempts were made, and the last
-- dispatch error (node offline, not acknowledged in time).
ALTER TABLE allocation_tasks ADD COLUMN attempts integer NOT NULL DEFAULT 0;
ALTER TABLE allocation_tasks ADD COLUMN last_error text CHECK (char_length(last_error) <= 1024);
CREATE INDEX allocation_tasks_pending_idx ON allocation_tasks (created_at) WHERE acked_at IS NULL AND finished_at IS NULL;

-- +goose Down
DROP INDEX allocation_tasks_pending_idx;
ALTER TABLE allocation_tasks DROP COLUMN last_error;
ALTER TABLE allocation_tasks DROP COLUMN attempts;
ALTER TABLE allocation_tasks DROP CONSTRAINT allocation_tasks_kind_check;
ALTER TABLE allocation_tasks ADD CONSTRAINT allocation_tasks_kind_check
    CHECK (kind IN ('allocation.provision', 'allocation.release'));
