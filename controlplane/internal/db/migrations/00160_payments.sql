-- Payments (docs/payments.md): top-ups taken through a payment provider, the provider's
-- webhook events (persisted, deduplicated by provider event id) and admin refunds.
-- Amounts are integer minor units of the payment's currency. A captured payment is
-- credited to the tenant wallet through the billing ledger in the same transaction as
-- its state change; ledger_txn_id records that posting.

-- +goose Up
CREATE TABLE payments (
    id                  uuid PRIMARY KEY,
    tenant_id           uuid NOT NULL REFERENCES tenants (id),
    created_by          uuid REFERENCES users (id),
    provider            text NOT NULL CHECK (provider IN ('stripe')),
    -- The provider's object id (a PaymentIntent id); NULL only inside the creating transaction.
    provider_payment_id text CHECK (char_length(provider_payment_id) BETWEEN 1 AND 255),
    currency            text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    amount_minor        bigint NOT NULL CHECK (amount_minor > 0),
    captured_minor      bigint NOT NULL DEFAULT 0 CHECK (captured_minor >= 0),
    refunded_minor      bigint NOT NULL DEFAULT 0 CHECK (refunded_minor >= 0),
    status              text NOT NULL CHECK (status IN ('created', 'pending', 'succeeded', 'partially_refunded',
                                                        'refunded', 'failed', 'canceled')),
    failure_code        text CHECK (char_length(failure_code) <= 64),
    ledger_txn_id       uuid,
    captured_at         timestamptz,
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL,
    -- Never refund more than was captured, whatever the code above does.
    CONSTRAINT payments_refund_le_captured CHECK (refunded_minor <= captured_minor),
    CONSTRAINT payments_captured_has_time CHECK ((captured_minor = 0) = (captured_at IS NULL)),
    CONSTRAINT payments_provider_payment_key UNIQUE (provider, provider_payment_id)
);
CREATE INDEX payments_tenant_idx ON payments (tenant_id, id);
CREATE INDEX payments_status_idx ON payments (status, id);

CREATE TABLE payment_refunds (
    id                 uuid PRIMARY KEY,
    payment_id         uuid NOT NULL REFERENCES payments (id),
    tenant_id          uuid NOT NULL REFERENCES tenants (id),
    currency           text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    amount_minor       bigint NOT NULL CHECK (amount_minor > 0),
    -- 'admin': requested through the admin API; 'provider': seen first in a provider event
    -- (a refund made in the provider's dashboard).
    origin             text NOT NULL CHECK (origin IN ('admin', 'provider')),
    status             text NOT NULL CHECK (status IN ('succeeded', 'pending')),
    provider_refund_id text CHECK (char_length(provider_refund_id) BETWEEN 1 AND 255),
    reason             text CHECK (char_length(reason) <= 500),
    requested_by       uuid REFERENCES users (id),
    ledger_txn_id      uuid,
    created_at         timestamptz NOT NULL,
    CONSTRAINT payment_refunds_provider_refund_key UNIQUE (provider_refund_id)
);
CREATE INDEX payment_refunds_payment_idx ON payment_refunds (payment_id, id);

CREATE TABLE payment_webhook_events (
    id                uuid PRIMARY KEY,
    provider          text NOT NULL CHECK (provider IN ('stripe')),
    provider_event_id text NOT NULL CHECK (char_length(provider_event_id) BETWEEN 1 AND 255),
    event_type        text NOT NULL CHECK (char_length(event_type) BETWEEN 1 AND 128),
    -- The provider object the event is about (PaymentIntent or Charge id) and, once
    -- matched, our payment.
    object_id         text CHECK (char_length(object_id) <= 255),
    payment_id        uuid REFERENCES payments (id),
    -- The verified body as the provider sent it (bounded by the webhook body cap).
    payload           jsonb NOT NULL,
    status            text NOT NULL CHECK (status IN ('received', 'processed', 'ignored', 'failed')),
    attempts          integer NOT NULL DEFAULT 0,
    last_error        text CHECK (char_length(last_error) <= 500),
    provider_created  timestamptz,
    received_at       timestamptz NOT NULL,
    processed_at      timestamptz,
    -- The dedupe rule: one row per provider event, whoever delivers it first.
    CONSTRAINT payment_webhook_events_provider_event_key UNIQUE (provider, provider_event_id)
);
CREATE INDEX payment_webhook_events_unprocessed_idx ON payment_webhook_events (received_at, id)
    WHERE status IN ('received', 'failed');

-- +goose Down
DROP TABLE payment_webhook_events;
DROP TABLE payment_refunds;
DROP TABLE payments;
