-- +goose Up
-- The attention counters and the needs_action filter look for a project's workloads in
-- a recovery condition (docs/operations.md, "Actionability"): few rows among thousands.
CREATE INDEX allocations_recovery_idx ON allocations (project_id, status, updated_at)
    WHERE status IN ('release_failed', 'restart_failed', 'failed');

-- +goose Down
DROP INDEX allocations_recovery_idx;
