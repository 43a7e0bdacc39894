-- +goose Up
-- GPU ownership (docs/allocation-lifecycle.md, "GPU ownership"): an allocation that
-- ended without its node confirming the workload gone (the report timeout, an admin
-- force-release, a workload the node still holds after its allocation ended) keeps its
-- GPUs (allocation_gpus.released_at stays NULL) with node_cleanup set, and the node gets
-- a cleanup task: an allocation.release task marked cleanup, delivered whatever the
-- allocation's status. The node's confirmation — that task succeeding, or the agent's
-- reconcile reporting the workload absent — frees the GPUs and clears node_cleanup.
ALTER TABLE allocation_tasks ADD COLUMN cleanup boolean NOT NULL DEFAULT false;
ALTER TABLE allocation_tasks ADD CONSTRAINT allocation_tasks_cleanup_kind_check
    CHECK (NOT cleanup OR kind = 'allocation.release');

-- +goose Down
ALTER TABLE allocation_tasks DROP CONSTRAINT allocation_tasks_cleanup_kind_check;
ALTER TABLE allocation_tasks DROP COLUMN cleanup;
