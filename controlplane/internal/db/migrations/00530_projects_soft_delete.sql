-- Deleting a project is a soft delete (issue 18 item 12): billing usage records refer to
-- their project by foreign key, and audit rows and ledger entries name it, so a project
-- that ever had an allocation cannot — and must not — vanish. A deleted project keeps its
-- row with deleted_at set; every query that lists or loads projects reads live ones only,
-- and its slug is free again for a new project of the tenant.
--
-- No live allocation may belong to a deleted project. Deletion refuses a project with
-- live allocations (tenancy.DeleteProject, under the project row's FOR UPDATE lock); the
-- trigger below is the other half: an allocation insert takes FOR KEY SHARE on its
-- project's row, which waits for a deletion in progress and then sees it deleted.
-- The two locks conflict, so one of them always sees the other's commit.

-- +goose Up
ALTER TABLE projects ADD COLUMN deleted_at timestamptz;
ALTER TABLE projects DROP CONSTRAINT projects_tenant_id_slug_key;
CREATE UNIQUE INDEX projects_live_slug_key ON projects (tenant_id, slug) WHERE deleted_at IS NULL;
-- The default project is never deleted; the live-only index keeps a tenant's project list
-- (ListTenantProjects) on live rows.
CREATE INDEX projects_live_tenant_idx ON projects (tenant_id, id) WHERE deleted_at IS NULL;
ALTER TABLE projects ADD CONSTRAINT projects_default_not_deleted CHECK (NOT (is_default AND deleted_at IS NOT NULL));

-- +goose StatementBegin
CREATE FUNCTION allocations_project_live() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    deleted timestamptz;
BEGIN
    -- FOR KEY SHARE waits for a deletion that holds the row FOR UPDATE, and then reads
    -- the row as that deletion left it. Allocations refer to their project by id only (no
    -- foreign key, like every cross-feature reference), so a project id with no row is
    -- not this trigger's business.
    SELECT p.deleted_at INTO deleted FROM projects p WHERE p.id = NEW.project_id FOR KEY SHARE;
    IF deleted IS NOT NULL THEN
        RAISE EXCEPTION 'project % was deleted', NEW.project_id
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'allocations_project_live';
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER allocations_project_live
    BEFORE INSERT ON allocations
    FOR EACH ROW EXECUTE FUNCTION allocations_project_live();

-- +goose Down
DROP TRIGGER allocations_project_live ON allocations;
DROP FUNCTION allocations_project_live();
-- Deleted projects stay (their history refers to them); this fails where a deleted and a
-- live project of one tenant share a slug.
ALTER TABLE projects DROP CONSTRAINT projects_default_not_deleted;
DROP INDEX projects_live_tenant_idx;
DROP INDEX projects_live_slug_key;
ALTER TABLE projects ADD CONSTRAINT projects_tenant_id_slug_key UNIQUE (tenant_id, slug);
ALTER TABLE projects DROP COLUMN deleted_at;
