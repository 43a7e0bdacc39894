-- +goose Up
-- The report-timeout sweep (allocations/reporttimeout.go) reads the acknowledged tasks
-- that were never reported on; tasks pile up forever (one per provision, release,
-- restart, stop), these stay a handful.
CREATE INDEX allocation_tasks_unreported_idx ON allocation_tasks (acked_at, task_id)
    WHERE acked_at IS NOT NULL AND finished_at IS NULL;

-- +goose Down
DROP INDEX allocation_tasks_unreported_idx;
