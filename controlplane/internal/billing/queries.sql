-- name: ListCurrencies :many
SELECT * FROM billing_currencies ORDER BY code;

-- name: EnsureAccount :exec
INSERT INTO billing_ledger_accounts (id, kind, tenant_id, currency, balance_minor, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $6)
ON CONFLICT (kind, tenant_id, currency) DO NOTHING;

-- name: FindAccount :one
-- mine: the row was created by the current, uncommitted transaction (not cacheable).
SELECT id, coalesce(xmin = pg_current_xact_id_if_assigned()::xid, false)::boolean AS mine FROM billing_ledger_accounts
WHERE kind = $1 AND tenant_id IS NOT DISTINCT FROM sqlc.narg('tenant_id')::uuid AND currency = $2;

-- name: InsertTxn :one
-- ON CONFLICT keeps the caller's transaction usable when the reference was posted
-- before (idempotent callers); no row means replay.
INSERT INTO billing_ledger_transactions (id, kind, tenant_id, reference, reverses_txn_id, fx_snapshot_id, memo,
                                         actor_user_id, correlation_id, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (reference) DO NOTHING
RETURNING id;

-- name: InsertTxns :exec
INSERT INTO billing_ledger_transactions (id, kind, tenant_id, reference, correlation_id, created_at)
SELECT unnest(@ids::uuid[]), @kind, unnest(@tenant_ids::uuid[]), unnest(@refs::text[]), @correlation_id, @created_at;

-- name: TxnByReference :one
SELECT * FROM billing_ledger_transactions WHERE reference = $1;

-- name: GetTxn :one
SELECT * FROM billing_ledger_transactions WHERE id = $1;

-- name: ApplyToAccount :one
-- Conditional: a wallet never goes below zero (the row lock serialises writers).
UPDATE billing_ledger_accounts SET balance_minor = balance_minor + @delta::bigint, updated_at = @now
WHERE id = @id AND balance_minor IS NOT NULL AND (kind <> 'tenant_wallet' OR balance_minor + @delta::bigint >= 0)
RETURNING balance_minor;

-- name: ApplyToAccounts :execrows
UPDATE billing_ledger_accounts a SET balance_minor = a.balance_minor + d.delta, updated_at = @now
FROM (SELECT unnest(@ids::uuid[]) AS id, unnest(@deltas::bigint[]) AS delta) d
WHERE a.id = d.id AND a.balance_minor IS NOT NULL AND (a.kind <> 'tenant_wallet' OR a.balance_minor + d.delta >= 0);

-- name: LockAccounts :many
SELECT id, kind, balance_minor FROM billing_ledger_accounts WHERE id = ANY(@ids::uuid[]) ORDER BY id FOR UPDATE;

-- name: InsertEntries :exec
INSERT INTO billing_ledger_entries (id, txn_id, account_id, currency, amount_minor, created_at)
SELECT unnest(@ids::uuid[]), unnest(@txn_ids::uuid[]), unnest(@account_ids::uuid[]), unnest(@currencies::text[]),
       unnest(@amounts::bigint[]), @created_at;

-- name: TxnEntries :many
SELECT e.*, a.kind AS account_kind, a.tenant_id AS account_tenant_id
FROM billing_ledger_entries e JOIN billing_ledger_accounts a ON a.id = e.account_id
WHERE e.txn_id = $1 ORDER BY e.id;

-- name: TenantWallets :many
SELECT currency, balance_minor::bigint AS balance_minor FROM billing_ledger_accounts
WHERE tenant_id = $1 AND kind = 'tenant_wallet' ORDER BY currency;

-- name: WalletBalance :one
SELECT balance_minor::bigint FROM billing_ledger_accounts
WHERE tenant_id = $1 AND kind = 'tenant_wallet' AND currency = $2;

-- name: TenantDefaultCurrency :one
SELECT default_currency FROM tenants WHERE id = $1;

-- name: TenantName :one
SELECT name, default_currency FROM tenants WHERE id = $1;

-- name: InsertFXSnapshot :one
INSERT INTO billing_fx_snapshots (id, source_currency, target_currency, rate, provider, provider_rate_id, captured_at, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (source_currency, target_currency, provider, captured_at) DO NOTHING
RETURNING *;

-- name: FXSnapshotByKey :one
SELECT * FROM billing_fx_snapshots
WHERE source_currency = $1 AND target_currency = $2 AND provider = $3 AND captured_at = $4;

-- name: GetFXSnapshot :one
SELECT * FROM billing_fx_snapshots WHERE id = $1;

-- name: LatestFXFrom :one
SELECT * FROM billing_fx_snapshots WHERE source_currency = $1
ORDER BY captured_at DESC, id DESC LIMIT 1;

-- name: GetBillingAccount :one
SELECT * FROM billing_accounts WHERE tenant_id = $1;

-- name: InsertPricingPlan :one
INSERT INTO billing_pricing_plans (id, name, is_default, created_at, updated_at)
VALUES ($1, $2, $3, $4, $4)
ON CONFLICT (name) DO NOTHING
RETURNING *;

-- name: ClearDefaultPlan :exec
UPDATE billing_pricing_plans SET is_default = false, updated_at = $1 WHERE is_default AND id <> $2;

-- name: GetPricingPlan :one
SELECT * FROM billing_pricing_plans WHERE id = $1;

-- name: GetPricingPlanForUpdate :one
SELECT * FROM billing_pricing_plans WHERE id = $1 FOR UPDATE;

-- name: DefaultPricingPlan :one
SELECT * FROM billing_pricing_plans WHERE is_default;

-- name: ListPricingPlans :many
SELECT * FROM billing_pricing_plans ORDER BY name LIMIT $1;

-- name: InsertPlanVersion :one
INSERT INTO billing_pricing_plan_versions (id, plan_id, version, effective_from, created_at)
VALUES ($1, $2, $3, $4, $5)
RETURNING *;

-- name: InsertPrices :exec
INSERT INTO billing_prices (version_id, usage_unit, currency, unit_price)
SELECT @version_id, unnest(@units::text[]), unnest(@currencies::text[]), unnest(@prices::text[]);

-- name: PlanVersions :many
SELECT * FROM billing_pricing_plan_versions WHERE plan_id = $1 ORDER BY effective_from, version;

-- name: PlanPrices :many
SELECT p.* FROM billing_prices p JOIN billing_pricing_plan_versions v ON v.id = p.version_id
WHERE v.plan_id = $1 ORDER BY v.effective_from, p.usage_unit, p.currency;

-- name: InsertUsageRecord :one
INSERT INTO billing_usage_records (id, tenant_id, project_id, requested_by_user_id, source, source_id, usage_unit,
                                   quantity, currency, bill_from, bill_to, rated_through, seg_from, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $10, $10, $12, $12)
ON CONFLICT (source, source_id) WHERE bill_to IS NULL DO NOTHING
RETURNING *;

-- name: OpenUsageBySource :one
SELECT * FROM billing_usage_records WHERE source = $1 AND source_id = $2 AND bill_to IS NULL;

-- name: LockUsageRecords :many
SELECT * FROM billing_usage_records WHERE id = ANY(@ids::uuid[]) ORDER BY id FOR UPDATE;

-- name: CloseUsageRecord :one
UPDATE billing_usage_records SET bill_to = @bill_to, updated_at = @now
WHERE id = @id AND bill_to IS NULL AND rated_through <= @bill_to
RETURNING *;

-- name: UpdateRatedRecords :exec
UPDATE billing_usage_records r SET rated_through = d.rated_through, rated_quantity_millis = d.rated_quantity_millis,
    seg_from = d.seg_from, seg_units = d.seg_units, seg_amount_minor = d.seg_amount_minor, updated_at = @now
FROM (SELECT unnest(@ids::uuid[]) AS id, unnest(@rated_throughs::timestamptz[]) AS rated_through,
             unnest(@rated_quantities::bigint[]) AS rated_quantity_millis, unnest(@seg_froms::timestamptz[]) AS seg_from,
             unnest(@seg_units::bigint[]) AS seg_units, unnest(@seg_amounts::bigint[]) AS seg_amount_minor) d
WHERE r.id = d.id;

-- name: UnratedRecordIDs :many
-- Open runs and closed runs not yet rated to their end.
SELECT id FROM billing_usage_records
WHERE (bill_to IS NULL OR rated_through < bill_to) AND (sqlc.narg('after')::uuid IS NULL OR id > sqlc.narg('after')::uuid)
ORDER BY id LIMIT $1;

-- name: RatingEvents :many
SELECT * FROM billing_rating_events WHERE rating_key = ANY(@keys::text[]);

-- name: InsertRatingEvents :exec
INSERT INTO billing_rating_events (rating_key, usage_record_id, through, cumulative_quantity_millis, ledger_txn_id, created_at)
SELECT unnest(@keys::text[]), unnest(@record_ids::uuid[]), unnest(@throughs::timestamptz[]),
       unnest(@quantities::bigint[]), nullif(unnest(@txn_ids::uuid[]), '00000000-0000-0000-0000-000000000000'::uuid),
       @created_at;

-- name: OpenUsage :many
-- Open runs of one tenant in one currency (the runway's running burn).
SELECT * FROM billing_usage_records WHERE tenant_id = $1 AND currency = $2 AND bill_to IS NULL;

-- name: WalletsWithOpenUsage :many
SELECT DISTINCT tenant_id, currency FROM billing_usage_records WHERE bill_to IS NULL;

-- name: RunwayBlocks :many
SELECT * FROM billing_runway_blocks ORDER BY tenant_id, currency;

-- name: InsertRunwayBlock :execrows
INSERT INTO billing_runway_blocks (tenant_id, currency, blocked_at, burn_per_second) VALUES ($1, $2, $3, $4)
ON CONFLICT DO NOTHING;

-- name: DeleteRunwayBlock :execrows
DELETE FROM billing_runway_blocks WHERE tenant_id = $1 AND currency = $2;

-- name: GetRunwayBlock :one
SELECT * FROM billing_runway_blocks WHERE tenant_id = $1 AND currency = $2;

-- name: Spent :one
SELECT coalesce(sum(amount_minor), 0)::bigint FROM billing_rated_usage_lines
WHERE tenant_id = @tenant_id AND currency = @currency AND bill_from >= @from_time AND bill_from < @to_time
  AND (sqlc.narg('project_id')::uuid IS NULL OR project_id = sqlc.narg('project_id')::uuid);

-- name: RecordLineTotals :many
-- Per usage record and segment: the booked cumulative units and amount, for shadow rating.
SELECT DISTINCT ON (usage_record_id, segment_from) usage_record_id, segment_from, cumulative_units,
       cumulative_amount_minor, unit_price, currency
FROM billing_rated_usage_lines
WHERE usage_record_id = ANY(@ids::uuid[])
ORDER BY usage_record_id, segment_from, cumulative_units DESC, id DESC;

-- name: RecordsByID :many
SELECT * FROM billing_usage_records WHERE tenant_id = $1 AND id = ANY(@ids::uuid[]) ORDER BY id;

-- name: CopyRatedLines :copyfrom
INSERT INTO billing_rated_usage_lines (id, usage_record_id, tenant_id, project_id, requested_by_user_id, usage_source,
    usage_unit, segment_from, bill_from, bill_to, unit_quantity_millis, units, cumulative_units, currency, unit_price,
    amount_minor, amount_exact, cumulative_amount_minor, pricing_source, pricing_plan_id, pricing_plan_version,
    pricing_snapshot, fx_snapshot_id, rating_event_key, rating_key, ledger_entry_id, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23,
        $24, $25, $26, $27);

-- name: ListLinesStartDesc :many
SELECT * FROM billing_rated_usage_lines
WHERE tenant_id = @tenant_id AND bill_from >= @from_time AND bill_from < @to_time
  AND (NOT @has_after::boolean OR (bill_from, id) < (@after_time::timestamptz, @after_id::uuid))
ORDER BY bill_from DESC, id DESC LIMIT @lim;

-- name: ListLinesStartAsc :many
SELECT * FROM billing_rated_usage_lines
WHERE tenant_id = @tenant_id AND bill_from >= @from_time AND bill_from < @to_time
  AND (NOT @has_after::boolean OR (bill_from, id) > (@after_time::timestamptz, @after_id::uuid))
ORDER BY bill_from, id LIMIT @lim;

-- name: ListLinesCostDesc :many
SELECT * FROM billing_rated_usage_lines
WHERE tenant_id = @tenant_id AND bill_from >= @from_time AND bill_from < @to_time
  AND (NOT @has_after::boolean OR (amount_minor, id) < (@after_amount::bigint, @after_id::uuid))
ORDER BY amount_minor DESC, id DESC LIMIT @lim;

-- name: ListLinesCostAsc :many
SELECT * FROM billing_rated_usage_lines
WHERE tenant_id = @tenant_id AND bill_from >= @from_time AND bill_from < @to_time
  AND (NOT @has_after::boolean OR (amount_minor, id) > (@after_amount::bigint, @after_id::uuid))
ORDER BY amount_minor, id LIMIT @lim;

-- name: FXSnapshotsByID :many
SELECT * FROM billing_fx_snapshots WHERE id = ANY(@ids::uuid[]);

-- name: LaunchPricing :one
-- CanLaunch's reads in one statement: the wallet's currency (the requested one, else the
-- tenant's default; '' when the tenant does not exist), the plan that prices the tenant
-- (its own, else the default), the price of one unit of usage_unit in that currency
-- under the plan's version in force at `at` ('' when none), the wallet's balance (0
-- without a wallet), and whether the wallet has open runs: only then does the runway
-- need the runs and the plan's whole schedule.
WITH cur AS (
    SELECT COALESCE(NULLIF(sqlc.arg('currency')::text, ''),
                    (SELECT t.default_currency FROM tenants t WHERE t.id = sqlc.arg('tenant_id')::uuid)) AS currency
), plan AS (
    SELECT COALESCE((SELECT a.customer_pricing_plan_id FROM billing_accounts a WHERE a.tenant_id = sqlc.arg('tenant_id')::uuid),
                    (SELECT p.id FROM billing_pricing_plans p WHERE p.is_default)) AS plan_id
), ver AS (
    SELECT v.id, v.version
    FROM billing_pricing_plan_versions v JOIN plan ON v.plan_id = plan.plan_id
    WHERE v.effective_from <= sqlc.arg('at')::timestamptz
    ORDER BY v.effective_from DESC, v.version DESC
    LIMIT 1
)
SELECT COALESCE(cur.currency, '')::text AS currency,
       (plan.plan_id IS NOT NULL)::boolean AS has_plan,
       COALESCE(plan.plan_id, '00000000-0000-0000-0000-000000000000')::uuid AS plan_id,
       COALESCE(ver.version, 0)::integer AS plan_version,
       COALESCE((SELECT pr.unit_price FROM billing_prices pr
                 WHERE pr.version_id = ver.id AND pr.usage_unit = sqlc.arg('usage_unit')::text AND pr.currency = cur.currency), '')::text AS unit_price,
       COALESCE((SELECT w.balance_minor FROM billing_ledger_accounts w
                 WHERE w.tenant_id = sqlc.arg('tenant_id')::uuid AND w.kind = 'tenant_wallet' AND w.currency = cur.currency), 0)::bigint AS balance_minor,
       EXISTS (SELECT 1 FROM billing_usage_records u
               WHERE u.tenant_id = sqlc.arg('tenant_id')::uuid AND u.currency = cur.currency AND u.bill_to IS NULL)::boolean AS open_usage
FROM cur CROSS JOIN plan LEFT JOIN ver ON true;
