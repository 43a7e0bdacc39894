-- Object storage: buckets, grants, quota (package storage). Objects and uploads are
-- written by storage/objects through the reservation primitives here.

-- name: BucketAccess :one
-- The access rule in one probe: the bucket of the owner project (of the caller's tenant)
-- and the strongest grant that reaches the caller: to their user (people), to their
-- service account (machines), or to a project of the tenant they act in (a person's
-- membership, a tenant admin's any project, a machine's token projects). 'read_write'
-- sorts after 'read', so max() is the strongest.
SELECT b.id, b.tenant_id, b.project_id, b.bucket_id, b.state, b.created_by, b.created_at, b.updated_at,
       coalesce(max(g.access), '')::text AS grant_access
FROM storage_buckets b
JOIN projects p ON p.id = b.project_id AND p.deleted_at IS NULL
LEFT JOIN storage_grants g ON g.bucket = b.id AND (
       (g.grantee_kind = 'user' AND g.grantee_id = sqlc.arg('user_id')::uuid AND sqlc.arg('person')::bool)
    OR (g.grantee_kind = 'service_account' AND g.grantee_id = sqlc.arg('service_account_id')::uuid)
    OR (g.grantee_kind = 'project' AND EXISTS (
           SELECT 1 FROM projects gp WHERE gp.id = g.grantee_id AND gp.tenant_id = b.tenant_id AND gp.deleted_at IS NULL
           AND (gp.id = ANY(sqlc.arg('machine_projects')::uuid[])
                OR (sqlc.arg('person')::bool AND (sqlc.arg('tenant_admin')::bool
                    OR EXISTS (SELECT 1 FROM project_members m WHERE m.project_id = gp.id AND m.user_id = sqlc.arg('user_id')::uuid)))))))
WHERE b.project_id = sqlc.arg('project_id') AND b.bucket_id = sqlc.arg('bucket_id') AND b.tenant_id = sqlc.arg('tenant_id')
GROUP BY b.id;

-- name: MemberRole :one
SELECT m.role FROM project_members m JOIN projects p ON p.id = m.project_id AND p.deleted_at IS NULL
WHERE m.project_id = $1 AND m.user_id = $2;
