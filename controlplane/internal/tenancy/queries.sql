-- Tenants ---------------------------------------------------------------------

-- name: InsertTenant :one
-- ON CONFLICT keeps the transaction usable when the slug is taken (no row comes back).
INSERT INTO tenants (id, name, slug, kind, default_currency, status, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, 'active', $6, $6)
ON CONFLICT (slug) DO NOTHING
RETURNING *;

-- name: GetTenant :one
SELECT * FROM tenants WHERE id = $1;

-- name: GetTenantForUpdate :one
SELECT * FROM tenants WHERE id = $1 FOR UPDATE;

-- name: ListTenants :many
SELECT * FROM tenants
WHERE sqlc.narg('after')::uuid IS NULL OR id > sqlc.narg('after')::uuid
ORDER BY id
LIMIT $1;

-- name: UpdateTenant :one
UPDATE tenants SET name = $2, status = $3, updated_at = $4 WHERE id = $1 RETURNING *;

-- Users -----------------------------------------------------------------------

-- name: InsertUser :one
INSERT INTO users (id, username, display_name, password_hash, role, tenant_id, tenant_role, status, created_at, updated_at)
VALUES ($1, $2, $3, $4, 'user', $5, $6, 'active', $7, $7)
ON CONFLICT (username) DO NOTHING
RETURNING *;

-- name: GetUser :one
SELECT * FROM users WHERE id = $1;

-- name: GetTenantUser :one
SELECT * FROM users WHERE id = $1 AND tenant_id = $2;

-- name: ListTenantUsers :many
SELECT * FROM users
WHERE tenant_id = $1 AND (sqlc.narg('after')::uuid IS NULL OR id > sqlc.narg('after')::uuid)
ORDER BY id
LIMIT $2;

-- Departments -----------------------------------------------------------------

-- name: InsertDepartment :one
INSERT INTO departments (id, tenant_id, display_name, slug, is_default, lifecycle_state, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, 'active', $6, $6)
ON CONFLICT (tenant_id, slug) DO NOTHING
RETURNING *;

-- name: GetDepartment :one
SELECT * FROM departments WHERE id = $1 AND tenant_id = $2;

-- name: GetDepartmentForUpdate :one
SELECT * FROM departments WHERE id = $1 AND tenant_id = $2 FOR UPDATE;

-- name: GetDefaultDepartment :one
SELECT * FROM departments WHERE tenant_id = $1 AND is_default;

-- name: ListDepartments :many
SELECT * FROM departments
WHERE tenant_id = $1 AND (sqlc.narg('after')::uuid IS NULL OR id > sqlc.narg('after')::uuid)
ORDER BY id
LIMIT $2;

-- name: UpdateDepartment :one
UPDATE departments SET display_name = $3, lifecycle_state = $4, updated_at = $5
WHERE id = $1 AND tenant_id = $2
RETURNING *;

-- Projects --------------------------------------------------------------------
-- A deleted project (deleted_at set: a soft delete that keeps its history) is read by
-- none of these: it is not listed, not loadable, not lockable, and its slug is free.

-- name: ProjectAccess :one
-- The project-context lookup of every project-scoped request: primary-key probes only.
-- It loads the whole project view so handlers read the project from the context instead
-- of querying it again.
SELECT p.id, p.tenant_id, t.name AS tenant_name, p.department_id, d.display_name AS department_name,
       d.slug AS department_slug, p.name, p.slug, p.is_default, p.created_at, p.updated_at,
       coalesce(m.role, '')::text AS member_role
FROM projects p
JOIN tenants t ON t.id = p.tenant_id
JOIN departments d ON d.id = p.department_id
LEFT JOIN project_members m ON m.project_id = p.id AND m.user_id = sqlc.arg('user_id')
WHERE p.id = sqlc.arg('project_id') AND p.deleted_at IS NULL;

-- name: InsertProject :one
INSERT INTO projects (id, tenant_id, department_id, name, slug, is_default, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $7)
ON CONFLICT (tenant_id, slug) WHERE deleted_at IS NULL DO NOTHING
RETURNING id;

-- name: LockProject :one
-- Serialises membership changes of one project (the last-owner rule reads then writes),
-- and a deletion with the allocation inserts of the project: FOR UPDATE conflicts with
-- the FOR KEY SHARE that allocations_project_live takes (migration 00530).
SELECT id FROM projects WHERE id = $1 AND deleted_at IS NULL FOR UPDATE;

-- name: GetProjectView :one
SELECT p.id, p.tenant_id, t.name AS tenant_name, p.department_id, d.display_name AS department_name,
       d.slug AS department_slug, p.name, p.slug, p.is_default, p.created_at, p.updated_at,
       coalesce(m.role, '')::text AS member_role
FROM projects p
JOIN tenants t ON t.id = p.tenant_id
JOIN departments d ON d.id = p.department_id
LEFT JOIN project_members m ON m.project_id = p.id AND m.user_id = sqlc.arg('user_id')
WHERE p.id = sqlc.arg('project_id') AND p.deleted_at IS NULL;

-- name: GetDefaultProject :one
SELECT p.id, p.name, t.name AS tenant_name
FROM projects p JOIN tenants t ON t.id = p.tenant_id
WHERE p.tenant_id = $1 AND p.is_default AND p.deleted_at IS NULL;

-- name: ListMemberProjects :many
-- Projects of a tenant the user is a member of.
SELECT p.id, p.tenant_id, t.name AS tenant_name, p.department_id, d.display_name AS department_name,
       d.slug AS department_slug, p.name, p.slug, p.is_default, p.created_at, p.updated_at,
       m.role AS member_role
FROM project_members m
JOIN projects p ON p.id = m.project_id
JOIN tenants t ON t.id = p.tenant_id
JOIN departments d ON d.id = p.department_id
WHERE m.user_id = sqlc.arg('user_id') AND p.tenant_id = sqlc.arg('tenant_id') AND p.deleted_at IS NULL
ORDER BY p.id
LIMIT sqlc.arg('max_rows');

-- name: ListTenantProjects :many
-- Every project of a tenant, with the user's membership role where there is one.
SELECT p.id, p.tenant_id, t.name AS tenant_name, p.department_id, d.display_name AS department_name,
       d.slug AS department_slug, p.name, p.slug, p.is_default, p.created_at, p.updated_at,
       coalesce(m.role, '')::text AS member_role
FROM projects p
JOIN tenants t ON t.id = p.tenant_id
JOIN departments d ON d.id = p.department_id
LEFT JOIN project_members m ON m.project_id = p.id AND m.user_id = sqlc.arg('user_id')
WHERE p.tenant_id = sqlc.arg('tenant_id') AND p.deleted_at IS NULL
ORDER BY p.id
LIMIT sqlc.arg('max_rows');

-- name: ProjectSlugTaken :one
SELECT EXISTS (SELECT 1 FROM projects WHERE tenant_id = $1 AND slug = $2 AND id <> $3 AND deleted_at IS NULL);

-- name: UpdateProject :exec
UPDATE projects SET name = $2, slug = $3, updated_at = $4 WHERE id = $1 AND deleted_at IS NULL;

-- name: SoftDeleteProject :execrows
-- The row stays: billing usage records refer to it, and audit rows and ledger entries
-- name it. Members stay too (the history of who could act there).
UPDATE projects SET deleted_at = sqlc.arg('deleted_at'), updated_at = sqlc.arg('deleted_at')
WHERE id = sqlc.arg('id') AND NOT is_default AND deleted_at IS NULL;

-- Members ---------------------------------------------------------------------

-- name: InsertMember :execrows
INSERT INTO project_members (project_id, user_id, role, created_at, updated_at)
VALUES ($1, $2, $3, $4, $4)
ON CONFLICT (project_id, user_id) DO NOTHING;

-- name: GetMember :one
SELECT m.project_id, m.user_id, u.username, m.role, m.created_at, m.updated_at
FROM project_members m JOIN users u ON u.id = m.user_id
WHERE m.project_id = $1 AND m.user_id = $2;

-- name: ListMembers :many
SELECT m.project_id, m.user_id, u.username, m.role, m.created_at, m.updated_at
FROM project_members m JOIN users u ON u.id = m.user_id
WHERE m.project_id = $1 AND (sqlc.narg('after')::uuid IS NULL OR m.user_id > sqlc.narg('after')::uuid)
ORDER BY m.user_id
LIMIT $2;

-- name: CountOwners :one
SELECT count(*) FROM project_members WHERE project_id = $1 AND role = 'owner';

-- name: UpdateMemberRole :exec
UPDATE project_members SET role = $3, updated_at = $4 WHERE project_id = $1 AND user_id = $2;

-- name: DeleteMember :exec
DELETE FROM project_members WHERE project_id = $1 AND user_id = $2;
