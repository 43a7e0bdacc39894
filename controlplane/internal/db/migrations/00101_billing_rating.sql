-- Billing accounts, versioned pricing plans, usage records, rating events and rated
-- usage lines (issue 3), and the runway watcher's blocks.

-- +goose Up
CREATE TABLE billing_accounts (
    id                       uuid PRIMARY KEY,
    tenant_id                uuid NOT NULL UNIQUE REFERENCES tenants (id),
    account_type             text NOT NULL DEFAULT 'tenant' CHECK (account_type IN ('tenant', 'reseller', 'end_customer')),
    customer_pricing_plan_id uuid,
    status                   text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'disabled', 'deleted')),
    created_at               timestamptz NOT NULL,
    updated_at               timestamptz NOT NULL
);

CREATE TABLE billing_pricing_plans (
    id         uuid PRIMARY KEY,
    name       text NOT NULL UNIQUE CHECK (char_length(name) BETWEEN 1 AND 120),
    is_default boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE UNIQUE INDEX billing_pricing_plans_one_default ON billing_pricing_plans (is_default) WHERE is_default;
ALTER TABLE billing_accounts ADD FOREIGN KEY (customer_pricing_plan_id) REFERENCES billing_pricing_plans (id);

-- A version takes effect at effective_from and holds until the next version's; versions
-- and their prices are immutable once written.
CREATE TABLE billing_pricing_plan_versions (
    id             uuid PRIMARY KEY,
    plan_id        uuid NOT NULL REFERENCES billing_pricing_plans (id),
    version        integer NOT NULL CHECK (version >= 1),
    effective_from timestamptz NOT NULL,
    created_at     timestamptz NOT NULL,
    UNIQUE (plan_id, version),
    UNIQUE (plan_id, effective_from)
);

CREATE TABLE billing_prices (
    version_id uuid NOT NULL REFERENCES billing_pricing_plan_versions (id),
    usage_unit text NOT NULL CHECK (usage_unit ~ '^[a-z0-9][a-z0-9._:-]{0,63}$'),
    currency   text NOT NULL REFERENCES billing_currencies (code),
    -- Exact decimal price of one unit (one unit-second), sub-minor precision allowed.
    unit_price text NOT NULL CHECK (unit_price ~ '^[0-9]{1,18}(\.[0-9]{1,18})?$'),
    PRIMARY KEY (version_id, usage_unit, currency)
);

CREATE TRIGGER billing_pricing_plan_versions_append_only BEFORE UPDATE OR DELETE ON billing_pricing_plan_versions
    FOR EACH ROW EXECUTE FUNCTION billing_append_only();
CREATE TRIGGER billing_prices_append_only BEFORE UPDATE OR DELETE ON billing_prices
    FOR EACH ROW EXECUTE FUNCTION billing_append_only();

-- One uninterrupted run of metered usage. quantity units are metered concurrently (for
-- example the GPUs of an allocation), so the run meters quantity x elapsed milliseconds.
-- bill_to is NULL while the run is still going.
CREATE TABLE billing_usage_records (
    id                    uuid PRIMARY KEY,
    tenant_id             uuid NOT NULL REFERENCES tenants (id),
    project_id            uuid REFERENCES projects (id),
    requested_by_user_id  uuid NOT NULL,
    source                text NOT NULL CHECK (source IN ('allocation', 'app_runtime')),
    source_id             uuid NOT NULL,
    usage_unit            text NOT NULL CHECK (usage_unit ~ '^[a-z0-9][a-z0-9._:-]{0,63}$'),
    quantity              bigint NOT NULL CHECK (quantity BETWEEN 1 AND 1000000),
    currency              text NOT NULL REFERENCES billing_currencies (code),
    bill_from             timestamptz NOT NULL,
    bill_to               timestamptz,
    rated_through         timestamptz NOT NULL,
    rated_quantity_millis bigint NOT NULL DEFAULT 0 CHECK (rated_quantity_millis >= 0),
    -- The segment rated last (runs are split at month and price-version boundaries) and
    -- its cumulative units and booked amount, which the next increment continues from.
    seg_from              timestamptz NOT NULL,
    seg_units             bigint NOT NULL DEFAULT 0,
    seg_amount_minor      bigint NOT NULL DEFAULT 0,
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL,
    CHECK (bill_to IS NULL OR bill_to >= bill_from),
    CHECK (rated_through >= bill_from AND (bill_to IS NULL OR rated_through <= bill_to))
);
CREATE UNIQUE INDEX billing_usage_records_one_open_run ON billing_usage_records (source, source_id) WHERE bill_to IS NULL;
CREATE INDEX billing_usage_records_open_idx ON billing_usage_records (tenant_id, currency) WHERE bill_to IS NULL;
CREATE INDEX billing_usage_records_unrated_idx ON billing_usage_records (id) WHERE bill_to IS NULL OR rated_through < bill_to;

-- One rating of a usage record's cumulative quantity. A repeated key with the same
-- cumulative quantity is the same rating; a different quantity is a conflict.
CREATE TABLE billing_rating_events (
    rating_key                 text PRIMARY KEY CHECK (char_length(rating_key) BETWEEN 1 AND 200),
    usage_record_id            uuid NOT NULL REFERENCES billing_usage_records (id),
    through                    timestamptz NOT NULL,
    cumulative_quantity_millis bigint NOT NULL,
    ledger_txn_id              uuid REFERENCES billing_ledger_transactions (id),
    created_at                 timestamptz NOT NULL
);

-- An increment of rated usage within one segment of a run (segments split the run at
-- month and price-version boundaries). cumulative_* are the segment's totals after this
-- line: amount_minor = round(unit_price x cumulative_units) - the segment's previous
-- cumulative_amount_minor, so increments always sum to the one-shot rating.
CREATE TABLE billing_rated_usage_lines (
    id                      uuid PRIMARY KEY,
    usage_record_id         uuid NOT NULL REFERENCES billing_usage_records (id),
    tenant_id               uuid NOT NULL REFERENCES tenants (id),
    project_id              uuid,
    requested_by_user_id    uuid NOT NULL,
    usage_source            text NOT NULL,
    usage_unit              text NOT NULL,
    segment_from            timestamptz NOT NULL,
    bill_from               timestamptz NOT NULL,
    bill_to                 timestamptz NOT NULL,
    unit_quantity_millis    bigint NOT NULL CHECK (unit_quantity_millis >= 0),
    units                   bigint NOT NULL CHECK (units >= 0),
    cumulative_units        bigint NOT NULL CHECK (cumulative_units >= 0),
    currency                text NOT NULL REFERENCES billing_currencies (code),
    unit_price              text NOT NULL,
    amount_minor            bigint NOT NULL,
    amount_exact            text NOT NULL,
    cumulative_amount_minor bigint NOT NULL,
    pricing_source          text NOT NULL,
    pricing_plan_id         uuid,
    pricing_plan_version    text,
    pricing_snapshot        jsonb NOT NULL,
    fx_snapshot_id          uuid REFERENCES billing_fx_snapshots (id),
    rating_event_key        text NOT NULL REFERENCES billing_rating_events (rating_key),
    rating_key              text NOT NULL UNIQUE,
    ledger_entry_id         uuid REFERENCES billing_ledger_entries (id),
    created_at              timestamptz NOT NULL,
    CHECK (bill_to >= bill_from)
);
CREATE INDEX billing_rated_lines_start_idx ON billing_rated_usage_lines (tenant_id, bill_from, id);
CREATE INDEX billing_rated_lines_cost_idx ON billing_rated_usage_lines (tenant_id, amount_minor, id);
CREATE INDEX billing_rated_lines_segment_idx ON billing_rated_usage_lines (usage_record_id, segment_from, cumulative_units DESC);
CREATE INDEX billing_rated_lines_spend_idx ON billing_rated_usage_lines (tenant_id, currency, bill_from);
CREATE TRIGGER billing_rated_usage_lines_append_only BEFORE UPDATE OR DELETE ON billing_rated_usage_lines
    FOR EACH ROW EXECUTE FUNCTION billing_append_only();
CREATE TRIGGER billing_rating_events_append_only BEFORE UPDATE OR DELETE ON billing_rating_events
    FOR EACH ROW EXECUTE FUNCTION billing_append_only();

-- A wallet whose runway fell under the floor: the watcher asked for the tenant's
-- running workloads to stop; a top-up that restores the runway lifts it.
CREATE TABLE billing_runway_blocks (
    tenant_id  uuid NOT NULL REFERENCES tenants (id),
    currency   text NOT NULL REFERENCES billing_currencies (code),
    blocked_at timestamptz NOT NULL,
    -- The running burn (currency units per second, exact decimal) when the block began:
    -- the block lifts once the available balance covers the minimum runway at that burn.
    burn_per_second text NOT NULL,
    PRIMARY KEY (tenant_id, currency)
);

-- +goose Down
DROP TABLE billing_runway_blocks;
DROP TABLE billing_rated_usage_lines;
DROP TABLE billing_rating_events;
DROP TABLE billing_usage_records;
DROP TABLE billing_prices;
DROP TABLE billing_pricing_plan_versions;
ALTER TABLE billing_accounts DROP CONSTRAINT IF EXISTS billing_accounts_customer_pricing_plan_id_fkey;
DROP TABLE billing_pricing_plans;
DROP TABLE billing_accounts;
