-- +goose Up
-- A repair operation acts through worker operations (restarts); each remembers the
-- repair that asked for it, so the repair finishes when they all have.
ALTER TABLE shared_runtime_worker_operations ADD COLUMN repair_operation_id uuid
    REFERENCES shared_runtime_repair_operations (id) ON DELETE CASCADE;
CREATE INDEX shared_runtime_worker_operations_repair_idx ON shared_runtime_worker_operations (repair_operation_id)
    WHERE repair_operation_id IS NOT NULL;
-- A restart replaces the worker's app instance; the one it replaced is remembered
-- until the new one is started.
ALTER TABLE shared_runtime_worker_operations ADD COLUMN replaced_instance_id uuid;

-- +goose Down
ALTER TABLE shared_runtime_worker_operations DROP COLUMN replaced_instance_id;
ALTER TABLE shared_runtime_worker_operations DROP COLUMN repair_operation_id;
