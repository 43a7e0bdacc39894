-- Billing ledger (issue 3): currencies with their ISO exponents, FX evidence, accounts
-- with balance projections, and immutable double-entry transactions. The database itself
-- refuses UPDATE/DELETE/TRUNCATE of entries, transactions and FX snapshots, refuses a
-- wallet below zero, and checks at commit that every transaction sums to zero per
-- currency.

-- +goose Up
CREATE TABLE billing_currencies (
    code     text PRIMARY KEY CHECK (code ~ '^[A-Z]{3}$'),
    exponent smallint NOT NULL CHECK (exponent BETWEEN 0 AND 4)
);
INSERT INTO billing_currencies (code, exponent) VALUES
    ('USD', 2), ('EUR', 2), ('GBP', 2), ('CHF', 2), ('CAD', 2), ('AUD', 2), ('SEK', 2),
    ('NOK', 2), ('DKK', 2), ('PLN', 2), ('SGD', 2), ('INR', 2), ('CNY', 2), ('BRL', 2),
    ('JPY', 0), ('KRW', 0),
    ('KWD', 3), ('BHD', 3), ('JOD', 3), ('OMR', 3);

-- Immutable FX evidence: a conversion references the snapshot it used and is never
-- revalued.
CREATE TABLE billing_fx_snapshots (
    id               uuid PRIMARY KEY,
    source_currency  text NOT NULL REFERENCES billing_currencies (code),
    target_currency  text NOT NULL REFERENCES billing_currencies (code),
    rate             text NOT NULL CHECK (rate ~ '^[0-9]{1,30}(\.[0-9]{1,30})?$' AND rate::numeric > 0),
    provider         text NOT NULL CHECK (char_length(provider) BETWEEN 1 AND 64),
    provider_rate_id text CHECK (char_length(provider_rate_id) <= 255),
    captured_at      timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    CHECK (source_currency <> target_currency),
    UNIQUE (source_currency, target_currency, provider, captured_at)
);
CREATE INDEX billing_fx_snapshots_latest_idx ON billing_fx_snapshots (source_currency, target_currency, captured_at DESC, id DESC);

-- Accounts. tenant_wallet is the prepaid balance (never below zero); tenant_receivable
-- holds usage the wallet could not cover (negative: the tenant owes it); the platform
-- accounts have no tenant.
CREATE TABLE billing_ledger_accounts (
    id            uuid PRIMARY KEY,
    kind          text NOT NULL CHECK (kind IN ('tenant_wallet', 'tenant_receivable', 'platform_revenue',
                                                'payment_clearing', 'fx', 'adjustments')),
    -- No foreign key: accounts are created outside the posting transaction (so their ids
    -- can be cached), and that must not wait on a tenant the caller has not committed.
    tenant_id     uuid,
    currency      text NOT NULL REFERENCES billing_currencies (code),
    -- Projection of tenant accounts: always the sum of the account's entries (updated in
    -- the transaction that posts them). Platform accounts, which every posting touches,
    -- keep no projection (NULL) so they never become a hot row; their balance is the sum.
    balance_minor bigint,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    CHECK ((tenant_id IS NULL) = (kind IN ('platform_revenue', 'payment_clearing', 'fx', 'adjustments'))),
    CHECK ((balance_minor IS NULL) = (tenant_id IS NULL)),
    CONSTRAINT billing_wallet_not_negative CHECK (kind <> 'tenant_wallet' OR balance_minor >= 0),
    UNIQUE NULLS NOT DISTINCT (kind, tenant_id, currency)
);
CREATE INDEX billing_ledger_accounts_tenant_idx ON billing_ledger_accounts (tenant_id, kind, currency);

CREATE TABLE billing_ledger_transactions (
    id              uuid PRIMARY KEY,
    kind            text NOT NULL CHECK (kind IN ('top_up', 'refund', 'usage', 'adjustment', 'conversion', 'reversal')),
    tenant_id       uuid REFERENCES tenants (id),
    -- What the posting answers for ("payment:<id>", "refund:<id>", "rating:<key>", ...):
    -- a second posting for the same reference is refused, which makes callers idempotent.
    reference       text NOT NULL UNIQUE CHECK (char_length(reference) BETWEEN 1 AND 300),
    reverses_txn_id uuid UNIQUE REFERENCES billing_ledger_transactions (id),
    fx_snapshot_id  uuid REFERENCES billing_fx_snapshots (id),
    memo            text NOT NULL DEFAULT '' CHECK (char_length(memo) <= 500),
    actor_user_id   uuid,
    correlation_id  text NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL,
    CHECK ((kind = 'reversal') = (reverses_txn_id IS NOT NULL)),
    CHECK ((kind = 'conversion') = (fx_snapshot_id IS NOT NULL))
);
CREATE INDEX billing_ledger_transactions_tenant_idx ON billing_ledger_transactions (tenant_id, created_at);

CREATE TABLE billing_ledger_entries (
    id           uuid PRIMARY KEY,
    txn_id       uuid NOT NULL REFERENCES billing_ledger_transactions (id),
    account_id   uuid NOT NULL REFERENCES billing_ledger_accounts (id),
    currency     text NOT NULL REFERENCES billing_currencies (code),
    -- Signed change of the account's balance; never zero.
    amount_minor bigint NOT NULL CHECK (amount_minor <> 0),
    created_at   timestamptz NOT NULL
);
CREATE INDEX billing_ledger_entries_txn_idx ON billing_ledger_entries (txn_id);
CREATE INDEX billing_ledger_entries_account_idx ON billing_ledger_entries (account_id, id);

-- +goose StatementBegin
CREATE FUNCTION billing_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER billing_ledger_entries_append_only BEFORE UPDATE OR DELETE ON billing_ledger_entries
    FOR EACH ROW EXECUTE FUNCTION billing_append_only();
CREATE TRIGGER billing_ledger_entries_no_truncate BEFORE TRUNCATE ON billing_ledger_entries
    FOR EACH STATEMENT EXECUTE FUNCTION billing_append_only();
CREATE TRIGGER billing_ledger_transactions_append_only BEFORE UPDATE OR DELETE ON billing_ledger_transactions
    FOR EACH ROW EXECUTE FUNCTION billing_append_only();
CREATE TRIGGER billing_ledger_transactions_no_truncate BEFORE TRUNCATE ON billing_ledger_transactions
    FOR EACH STATEMENT EXECUTE FUNCTION billing_append_only();
CREATE TRIGGER billing_fx_snapshots_append_only BEFORE UPDATE OR DELETE ON billing_fx_snapshots
    FOR EACH ROW EXECUTE FUNCTION billing_append_only();
CREATE TRIGGER billing_fx_snapshots_no_truncate BEFORE TRUNCATE ON billing_fx_snapshots
    FOR EACH STATEMENT EXECUTE FUNCTION billing_append_only();
REVOKE UPDATE, DELETE, TRUNCATE ON billing_ledger_entries, billing_ledger_transactions, billing_fx_snapshots FROM PUBLIC;

-- At commit, each transaction's entries must sum to zero per currency and an entry's
-- currency must be its account's.
-- +goose StatementBegin
CREATE FUNCTION billing_ledger_txn_balanced() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM billing_ledger_entries e
               WHERE e.txn_id = NEW.txn_id
               GROUP BY e.currency HAVING sum(e.amount_minor) <> 0) THEN
        RAISE EXCEPTION 'ledger transaction % does not sum to zero', NEW.txn_id
            USING ERRCODE = 'check_violation';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM billing_ledger_accounts a WHERE a.id = NEW.account_id AND a.currency = NEW.currency) THEN
        RAISE EXCEPTION 'ledger entry % currency differs from its account', NEW.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE CONSTRAINT TRIGGER billing_ledger_entries_balanced
    AFTER INSERT ON billing_ledger_entries DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION billing_ledger_txn_balanced();

-- +goose Down
DROP TABLE billing_ledger_entries;
DROP TABLE billing_ledger_transactions;
DROP TABLE billing_ledger_accounts;
DROP TABLE billing_fx_snapshots;
DROP TABLE billing_currencies;
DROP FUNCTION billing_ledger_txn_balanced();
DROP FUNCTION billing_append_only();
