-- Indexes for the tenancy read paths: project listings of a tenant by id, and the owner
-- count behind the last-owner rule.

-- +goose Up
CREATE INDEX projects_tenant_idx ON projects (tenant_id, id);
CREATE INDEX project_members_owner_idx ON project_members (project_id) WHERE role = 'owner';

-- +goose Down
DROP INDEX project_members_owner_idx;
DROP INDEX projects_tenant_idx;
