-- name: InsertPayment :one
INSERT INTO payments (id, tenant_id, created_by, provider, currency, amount_minor, status, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, 'created', $7, $7)
RETURNING *;

-- name: SetProviderPaymentID :one
UPDATE payments SET provider_payment_id = $2, updated_at = $3 WHERE id = $1 RETURNING *;

-- name: GetPayment :one
SELECT * FROM payments WHERE id = $1;

-- name: LockPayment :one
SELECT * FROM payments WHERE id = $1 FOR UPDATE;

-- name: LockPaymentByProviderID :one
SELECT * FROM payments WHERE provider = $1 AND provider_payment_id = $2 FOR UPDATE;

-- name: UpdatePaymentState :one
UPDATE payments
SET status = $2, captured_minor = $3, captured_at = $4, failure_code = $5, ledger_txn_id = $6,
    refunded_minor = $7, updated_at = $8
WHERE id = $1
RETURNING *;

-- name: ListTenantPayments :many
SELECT * FROM payments
WHERE tenant_id = $1 AND (sqlc.narg('after')::uuid IS NULL OR id < sqlc.narg('after')::uuid)
ORDER BY id DESC
LIMIT $2;

-- name: ListPayments :many
SELECT * FROM payments
WHERE (sqlc.narg('tenant_id')::uuid IS NULL OR tenant_id = sqlc.narg('tenant_id')::uuid)
  AND (sqlc.narg('status')::text IS NULL OR status = sqlc.narg('status')::text)
  AND (sqlc.narg('after')::uuid IS NULL OR id < sqlc.narg('after')::uuid)
ORDER BY id DESC
LIMIT $1;

-- name: ListStalePayments :many
-- Payments the provider may have settled without a webhook reaching us; abandoned ones
-- stop being asked about once created before created_after.
SELECT * FROM payments
WHERE status IN ('created', 'pending') AND provider_payment_id IS NOT NULL
  AND updated_at < sqlc.arg('quiet_since') AND created_at > sqlc.arg('created_after')
ORDER BY id DESC
LIMIT sqlc.arg('batch');

-- name: InsertRefund :one
INSERT INTO payment_refunds (id, payment_id, tenant_id, currency, amount_minor, origin, status,
                             provider_refund_id, reason, requested_by, ledger_txn_id, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
RETURNING *;

-- name: RefundByProviderID :one
SELECT * FROM payment_refunds WHERE provider_refund_id = $1;

-- name: InsertWebhookEvent :one
-- ON CONFLICT keeps the first delivery: a duplicate (or a concurrent duplicate, which
-- waits on the unique index until the first commits) returns no row.
INSERT INTO payment_webhook_events (id, provider, provider_event_id, event_type, object_id, payload, status,
                                    provider_created, received_at)
VALUES ($1, $2, $3, $4, $5, $6, 'received', $7, $8)
ON CONFLICT (provider, provider_event_id) DO NOTHING
RETURNING *;

-- name: GetWebhookEvent :one
SELECT * FROM payment_webhook_events WHERE provider = $1 AND provider_event_id = $2;

-- name: WebhookEventByID :one
SELECT * FROM payment_webhook_events WHERE id = $1;

-- name: LockWebhookEvent :one
SELECT * FROM payment_webhook_events WHERE id = $1 FOR UPDATE;

-- name: FinishWebhookEvent :exec
UPDATE payment_webhook_events
SET status = $2, payment_id = $3, attempts = attempts + 1, last_error = $4, processed_at = $5
WHERE id = $1;

-- name: FailWebhookEvent :exec
UPDATE payment_webhook_events
SET status = 'failed', attempts = attempts + 1, last_error = $2
WHERE id = $1 AND status IN ('received', 'failed');

-- name: ListUnprocessedEvents :many
SELECT id FROM payment_webhook_events
WHERE status IN ('received', 'failed') AND received_at < $1 AND attempts < $2
ORDER BY received_at, id
LIMIT $3;
