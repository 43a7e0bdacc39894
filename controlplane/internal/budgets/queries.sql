-- Budgets -----------------------------------------------------------------------

-- name: InsertBudget :one
INSERT INTO budgets (id, tenant_id, project_id, scope_type, name, period, amount_minor, currency,
    threshold_percent, enforcement_mode, active, starts_at, ends_at, created_by, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $15)
RETURNING *;

-- name: CountTenantBudgets :one
SELECT count(*) FROM budgets WHERE tenant_id = $1;

-- name: LockTenantBudgets :exec
-- Serialises creates of one tenant, so the per-tenant cap holds under concurrency.
SELECT pg_advisory_xact_lock(hashtextextended('budgets:' || sqlc.arg('tenant_id')::uuid::text, 0));

-- name: LockBudget :one
SELECT * FROM budgets WHERE id = $1 AND tenant_id = $2 FOR UPDATE;

-- name: GetBudget :one
SELECT sqlc.embed(b), COALESCE(p.department_id, d.id)::uuid AS department_id
FROM budgets b
LEFT JOIN projects p ON p.id = b.project_id
LEFT JOIN departments d ON d.tenant_id = b.tenant_id AND d.is_default
WHERE b.id = $1 AND b.tenant_id = $2;

-- name: ListBudgets :many
-- A tenant's budgets, optionally one project's or one scope's, oldest first. The
-- department is the project's (project scope) or the tenant's default department.
SELECT sqlc.embed(b), COALESCE(p.department_id, d.id)::uuid AS department_id
FROM budgets b
LEFT JOIN projects p ON p.id = b.project_id
LEFT JOIN departments d ON d.tenant_id = b.tenant_id AND d.is_default
WHERE b.tenant_id = $1
  AND (sqlc.narg('project_id')::uuid IS NULL OR b.project_id = sqlc.narg('project_id')::uuid)
  AND (sqlc.narg('scope_type')::text IS NULL OR b.scope_type = sqlc.narg('scope_type')::text)
ORDER BY b.id
LIMIT $2;

-- name: UpdateBudget :one
UPDATE budgets SET name = $3, period = $4, amount_minor = $5, currency = $6, threshold_percent = $7,
    enforcement_mode = $8, active = $9, starts_at = $10, ends_at = $11, updated_at = $12
WHERE id = $1 AND tenant_id = $2
RETURNING *;

-- name: DeleteBudget :execrows
DELETE FROM budgets WHERE id = $1 AND tenant_id = $2;

-- name: ApplicableBudgets :many
-- The active budgets a launch in the project is measured against: the tenant's and,
-- when a project is given, that project's.
SELECT * FROM budgets
WHERE tenant_id = $1 AND active
  AND (scope_type = 'tenant' OR project_id = sqlc.narg('project_id')::uuid)
ORDER BY id;

-- name: ActiveBudgets :many
SELECT * FROM budgets WHERE tenant_id = $1 AND active ORDER BY id;

-- name: TenantsWithActiveBudgets :many
SELECT DISTINCT tenant_id FROM budgets WHERE active ORDER BY tenant_id;

-- Events ------------------------------------------------------------------------

-- name: LatestEvents :many
-- The latest event of each budget (by last observation).
SELECT DISTINCT ON (budget_id) * FROM budget_events
WHERE budget_id = ANY(sqlc.arg('budget_ids')::uuid[])
ORDER BY budget_id, last_seen_at DESC, id DESC;

-- name: ObserveEvent :one
-- Opens the event of (budget, period, threshold_key), or records one more sighting of
-- it. Status never moves here. inserted is true when this call opened it.
INSERT INTO budget_events AS e (id, budget_id, tenant_id, threshold_key, level_percent, period_start, period_end,
    spent_minor, budget_minor, currency, percent_used, first_seen_at, last_seen_at, correlation_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $12, $13)
ON CONFLICT (budget_id, period_start, threshold_key) DO UPDATE
SET seen_count = e.seen_count + 1,
    last_seen_at = GREATEST(e.last_seen_at, EXCLUDED.last_seen_at),
    period_end = EXCLUDED.period_end,
    spent_minor = EXCLUDED.spent_minor,
    budget_minor = EXCLUDED.budget_minor,
    currency = EXCLUDED.currency,
    percent_used = EXCLUDED.percent_used
RETURNING sqlc.embed(e), (xmax = 0)::boolean AS inserted;

-- name: MarkSuspendRequested :execrows
UPDATE budget_events SET suspend_requested_at = $2 WHERE id = $1 AND suspend_requested_at IS NULL;

-- name: GetEventScope :one
-- An event of the tenant with the scope of its budget (for permission checks).
SELECT sqlc.embed(e), b.scope_type, b.project_id
FROM budget_events e JOIN budgets b ON b.id = e.budget_id
WHERE e.id = $1 AND e.tenant_id = $2
FOR UPDATE OF e;

-- name: SetEventStatus :one
UPDATE budget_events SET status = $2,
    acknowledged_at = COALESCE(acknowledged_at, sqlc.narg('acknowledged_at')),
    acknowledged_by = COALESCE(acknowledged_by, sqlc.narg('acknowledged_by')),
    resolved_at = COALESCE(resolved_at, sqlc.narg('resolved_at')),
    resolved_by = COALESCE(resolved_by, sqlc.narg('resolved_by'))
WHERE id = $1
RETURNING *;
