-- Object storage (docs/storage.md): buckets, objects, grants, quota and the bookkeeping
-- that keeps the quota exact while bytes stream. Object bytes never live here: a row
-- names the opaque blob key of its current version in the blob driver.

-- +goose Up
CREATE TABLE storage_buckets (
    -- Internal id: blob keys and references use it, so a bucket_id can be reused after
    -- a delete without ever meeting the old bucket's bytes.
    id                  uuid PRIMARY KEY,
    tenant_id           uuid NOT NULL REFERENCES tenants (id),
    project_id          uuid NOT NULL REFERENCES projects (id),
    bucket_id           text COLLATE "C" NOT NULL CHECK (bucket_id ~ '^[A-Za-z0-9][A-Za-z0-9:_./-]{0,127}$'),
    -- active, or deleting after a forced delete while the sweeper removes its objects.
    state               text NOT NULL CHECK (state IN ('active', 'deleting')),
    created_by          uuid,
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL,
    delete_requested_at timestamptz,
    CHECK ((state = 'deleting') = (delete_requested_at IS NOT NULL)),
    -- bucket_id is the user's name for it inside the project (also the list order).
    CONSTRAINT storage_buckets_project_bucket_key UNIQUE (project_id, bucket_id)
);
-- The force-delete sweeper's queue.
CREATE INDEX storage_buckets_deleting_idx ON storage_buckets (delete_requested_at) WHERE state = 'deleting';

CREATE TABLE storage_objects (
    -- No cascade: the force-delete sweeper removes rows in batches so the quota is freed
    -- as it goes (and the bytes are queued for deletion with them).
    bucket       uuid NOT NULL REFERENCES storage_buckets (id),
    -- The canonical path (storage/objpath): byte order is the listing order.
    path         text COLLATE "C" NOT NULL CHECK (octet_length(path) BETWEEN 1 AND 1024),
    project_id   uuid NOT NULL REFERENCES projects (id),
    blob_key     text NOT NULL UNIQUE CHECK (char_length(blob_key) BETWEEN 1 AND 512),
    size_bytes   bigint NOT NULL CHECK (size_bytes >= 0),
    etag         text NOT NULL CHECK (char_length(etag) BETWEEN 1 AND 66),
    content_type text NOT NULL CHECK (char_length(content_type) BETWEEN 1 AND 255),
    created_by   uuid,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    PRIMARY KEY (bucket, path)
);
-- The quota recompute (Σ per project).
CREATE INDEX storage_objects_project_idx ON storage_objects (project_id);

-- Usage per project. The limits are not here: they are the tenant's default
-- (storage_tenant_quotas) or the platform's (GANTRY_STORAGE_DEFAULT_QUOTA_*), read at
-- each reservation, so an admin's change applies at once.
-- Invariant: used_* = the project's storage_objects (Σ size_bytes, count);
-- reserved_* = Σ of its storage_uploads rows.
CREATE TABLE storage_quotas (
    project_id       uuid PRIMARY KEY REFERENCES projects (id),
    tenant_id        uuid NOT NULL REFERENCES tenants (id),
    used_bytes       bigint NOT NULL DEFAULT 0 CHECK (used_bytes >= 0),
    used_objects     bigint NOT NULL DEFAULT 0 CHECK (used_objects >= 0),
    reserved_bytes   bigint NOT NULL DEFAULT 0 CHECK (reserved_bytes >= 0),
    reserved_objects bigint NOT NULL DEFAULT 0 CHECK (reserved_objects >= 0),
    updated_at       timestamptz NOT NULL
);

-- A tenant's default quota for each of its projects, set by a platform admin.
CREATE TABLE storage_tenant_quotas (
    tenant_id   uuid PRIMARY KEY REFERENCES tenants (id),
    max_bytes   bigint NOT NULL CHECK (max_bytes >= 0),
    max_objects bigint NOT NULL CHECK (max_objects >= 0),
    updated_by  uuid,
    updated_at  timestamptz NOT NULL
);

-- Open reservations of uploads in flight. An upload that ends (committed or failed)
-- deletes its row and gives back what it held; one whose process died is found by
-- expires_at and freed by the sweeper, which also deletes its blob.
CREATE TABLE storage_uploads (
    id               uuid PRIMARY KEY,
    project_id       uuid NOT NULL REFERENCES projects (id),
    bucket           uuid NOT NULL REFERENCES storage_buckets (id),
    blob_key         text NOT NULL CHECK (char_length(blob_key) BETWEEN 1 AND 512),
    reserved_bytes   bigint NOT NULL CHECK (reserved_bytes >= 0),
    reserved_objects bigint NOT NULL CHECK (reserved_objects >= 0),
    started_at       timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL
);
CREATE INDEX storage_uploads_expires_idx ON storage_uploads (expires_at);
CREATE INDEX storage_uploads_project_idx ON storage_uploads (project_id);

-- Blobs to delete once the transaction that unreferenced them has committed (a
-- replaced or deleted object's old version, a force-deleted bucket's objects).
CREATE TABLE storage_blob_gc (
    blob_key    text PRIMARY KEY CHECK (char_length(blob_key) BETWEEN 1 AND 512),
    enqueued_at timestamptz NOT NULL
);
CREATE INDEX storage_blob_gc_enqueued_idx ON storage_blob_gc (enqueued_at);

-- Who else may use a bucket: another project of the same tenant, a user or a service
-- account of the tenant (checked when granted), with read or read_write access.
CREATE TABLE storage_grants (
    id           uuid PRIMARY KEY,
    bucket       uuid NOT NULL REFERENCES storage_buckets (id) ON DELETE CASCADE,
    tenant_id    uuid NOT NULL REFERENCES tenants (id),
    grantee_kind text NOT NULL CHECK (grantee_kind IN ('project', 'user', 'service_account')),
    grantee_id   uuid NOT NULL,
    access       text NOT NULL CHECK (access IN ('read', 'read_write')),
    created_by   uuid,
    created_at   timestamptz NOT NULL,
    CONSTRAINT storage_grants_bucket_grantee_key UNIQUE (bucket, grantee_kind, grantee_id)
);
-- The access check looks grants up by grantee.
CREATE INDEX storage_grants_grantee_idx ON storage_grants (grantee_kind, grantee_id);

-- +goose Down
DROP TABLE storage_grants;
DROP TABLE storage_blob_gc;
DROP TABLE storage_uploads;
DROP TABLE storage_tenant_quotas;
DROP TABLE storage_quotas;
DROP TABLE storage_objects;
DROP TABLE storage_buckets;
