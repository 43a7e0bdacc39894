-- +goose Up
-- Buckets attached into allocations (storage/attach, docs/storage.md "Attachments").
-- One row per attachment; its state follows the table in storage/attach/state.go. The
-- row also carries the task the node's agent has to run for it now (storage.attach
-- while attaching, storage.detach while detaching): the attach package delivers it over
-- the fabric and a sweep redelivers what was not acknowledged.
CREATE TABLE storage_attachments (
    id              uuid PRIMARY KEY,
    allocation_id   uuid NOT NULL REFERENCES allocations (id) ON DELETE CASCADE,
    tenant_id       uuid NOT NULL,
    -- The allocation's project (who attached it) and the bucket's owner project (the
    -- same, or another project of the tenant that granted it access).
    project_id      uuid NOT NULL,
    bucket          uuid NOT NULL REFERENCES storage_buckets (id) ON DELETE CASCADE,
    bucket_project  uuid NOT NULL,
    bucket_id       text NOT NULL CHECK (char_length(bucket_id) BETWEEN 1 AND 128),
    mode            text NOT NULL CHECK (mode IN ('ro', 'rw')),
    -- Relative to the runtime user's home, never empty (the default is filled in).
    mount_path      text NOT NULL CHECK (char_length(mount_path) BETWEEN 1 AND 1024),
    state           text NOT NULL CHECK (state IN ('attaching', 'attached', 'detaching', 'detached', 'failed')),
    method          text CHECK (method IN ('fuse', 'copy')),
    -- The absolute path on the node the agent reported.
    host_path       text CHECK (char_length(host_path) <= 4096),
    error           text CHECK (char_length(error) <= 1024),
    created_by      uuid,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    attached_at     timestamptz,
    detached_at     timestamptz,
    -- The task the agent runs for the current state (NULL when none is wanted).
    task_id         uuid UNIQUE,
    task_kind       text CHECK (task_kind IN ('storage.attach', 'storage.detach')),
    task_created_at timestamptz,
    task_acked_at   timestamptz,
    task_attempts   integer NOT NULL DEFAULT 0,
    task_last_error text CHECK (char_length(task_last_error) <= 1024)
);

-- One live mount per mount path of an allocation (so at most one live attachment of a
-- bucket per mount path).
CREATE UNIQUE INDEX storage_attachments_live_path_key ON storage_attachments (allocation_id, mount_path)
    WHERE state IN ('attaching', 'attached', 'detaching');
CREATE INDEX storage_attachments_allocation_idx ON storage_attachments (allocation_id, created_at, id);
CREATE INDEX storage_attachments_bucket_idx ON storage_attachments (bucket) WHERE state IN ('attaching', 'attached', 'detaching');
-- The delivery sweep reads only tasks not acknowledged yet.
CREATE INDEX storage_attachments_pending_task_idx ON storage_attachments (task_created_at)
    WHERE task_id IS NOT NULL AND task_acked_at IS NULL;

-- +goose Down
DROP TABLE storage_attachments;
