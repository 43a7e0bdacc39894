-- Invoices (issue 24, docs/invoices.md): a period close builds a draft per tenant,
-- currency and period from the period's rated usage, adjustments and credits, with its
-- tax lines; issuing numbers it (gapless per seller) and freezes it; payments, void and
-- write-off move it on. The database stands behind the code: one invoice per tenant,
-- currency and period start, numbers unique per seller, totals that add up, and lines
-- and amounts that no longer change once the invoice left draft.

-- +goose Up
-- The last number given per seller ('platform', or 'reseller:<tenant id>'). Issuing
-- increments it in the issuing transaction: the row lock serializes issuers and a
-- rolled-back issue gives its number back, so numbers have no gaps.
CREATE TABLE billing_invoice_sequences (
    seller_key  text PRIMARY KEY CHECK (char_length(seller_key) BETWEEN 1 AND 100),
    prefix      text NOT NULL CHECK (prefix ~ '^[A-Z0-9-]{1,24}$'),
    last_number bigint NOT NULL CHECK (last_number >= 0)
);

CREATE TABLE billing_invoices (
    id                        uuid PRIMARY KEY,
    tenant_id                 uuid NOT NULL REFERENCES tenants (id),
    billing_account_id        uuid,
    seller_key                text NOT NULL CHECK (char_length(seller_key) BETWEEN 1 AND 100),
    currency                  text NOT NULL REFERENCES billing_currencies (code),
    period_start              timestamptz NOT NULL,
    period_end                timestamptz NOT NULL,
    status                    text NOT NULL CHECK (status IN ('draft', 'issued', 'due', 'paid', 'partially_paid', 'void', 'write_off')),
    sequence_number           bigint CHECK (sequence_number >= 1),
    number                    text CHECK (char_length(number) BETWEEN 1 AND 64),
    -- Σ charge lines (rated usage, fees, adjustments), Σ tax lines, Σ credits (>= 0):
    -- total = subtotal + tax - credits, exactly.
    subtotal_minor            bigint NOT NULL,
    tax_total_minor           bigint NOT NULL CHECK (tax_total_minor >= 0),
    credits_minor             bigint NOT NULL CHECK (credits_minor >= 0),
    total_minor               bigint NOT NULL,
    -- What the prepaid wallet already paid of the charges when they were rated (the
    -- payment lines), and payments applied after issue.
    prepaid_minor             bigint NOT NULL CHECK (prepaid_minor >= 0),
    -- Σ payment lines: money received in the period (not in the total).
    received_minor            bigint NOT NULL CHECK (received_minor >= 0),
    paid_minor                bigint NOT NULL DEFAULT 0 CHECK (paid_minor >= 0),
    tax_jurisdiction          text,
    tax_treatment             text NOT NULL CHECK (tax_treatment IN ('not_configured', 'standard', 'tax_exempt', 'reverse_charge')),
    seller_tax_registration   text,
    customer_tax_registration text,
    tax_snapshot              jsonb NOT NULL,
    seller_name               text NOT NULL,
    customer_name             text NOT NULL,
    legal_note                text,
    payment_terms_days        integer NOT NULL CHECK (payment_terms_days BETWEEN 0 AND 365),
    issued_at                 timestamptz,
    due_at                    timestamptz,
    finalized_at              timestamptz,
    paid_at                   timestamptz,
    voided_at                 timestamptz,
    written_off_at            timestamptz,
    void_reason               text CHECK (char_length(void_reason) <= 500),
    recredit_txn_id           uuid,
    created_at                timestamptz NOT NULL,
    updated_at                timestamptz NOT NULL,
    CHECK (period_end > period_start),
    CHECK (total_minor = subtotal_minor + tax_total_minor - credits_minor),
    CHECK (paid_minor + prepaid_minor <= greatest(total_minor, prepaid_minor)),
    CHECK ((sequence_number IS NULL) = (number IS NULL)),
    CHECK (status IN ('draft', 'void') OR sequence_number IS NOT NULL),
    CHECK (status <> 'draft' OR sequence_number IS NULL),
    -- Closing the same period twice finds this row: the close is idempotent.
    CONSTRAINT billing_invoices_period_key UNIQUE (tenant_id, currency, period_start),
    CONSTRAINT billing_invoices_number_key UNIQUE (seller_key, sequence_number)
);
CREATE INDEX billing_invoices_tenant_idx ON billing_invoices (tenant_id, period_start DESC, id DESC);
CREATE INDEX billing_invoices_period_idx ON billing_invoices (period_start DESC, id DESC);

CREATE TABLE billing_invoice_lines (
    id                    uuid PRIMARY KEY,
    invoice_id            uuid NOT NULL REFERENCES billing_invoices (id),
    position              integer NOT NULL CHECK (position >= 0),
    line_type             text NOT NULL CHECK (line_type IN ('rated_usage', 'credit', 'adjustment', 'tax', 'fee', 'payment')),
    description           text NOT NULL CHECK (char_length(description) BETWEEN 1 AND 500),
    currency              text NOT NULL REFERENCES billing_currencies (code),
    -- Charges and tax are >= 0; a credit is the amount taken off (>= 0); a payment line
    -- is the amount already paid (>= 0) and does not enter the total.
    amount_minor          bigint NOT NULL CHECK (amount_minor >= 0),
    rated_usage_line_id   uuid REFERENCES billing_rated_usage_lines (id),
    ledger_entry_id       uuid,
    payment_session_id    uuid,
    tax_category          text,
    tax_rate_bps          integer CHECK (tax_rate_bps BETWEEN 0 AND 10000),
    tax_jurisdiction      text,
    tax_subject_line_id   uuid REFERENCES billing_invoice_lines (id),
    tax_exempt_reason     text,
    reverse_charge_reason text,
    tax_evidence          jsonb NOT NULL,
    created_at            timestamptz NOT NULL,
    UNIQUE (invoice_id, position),
    CHECK ((line_type = 'tax') = (tax_subject_line_id IS NOT NULL))
);
CREATE INDEX billing_invoice_lines_invoice_idx ON billing_invoice_lines (invoice_id, position);
-- A rated usage line is invoiced once: its invoice line claims it (a voided invoice keeps
-- its lines, so voided charges are cancelled, not billed again).
CREATE UNIQUE INDEX billing_invoice_lines_rated_once ON billing_invoice_lines (rated_usage_line_id) WHERE rated_usage_line_id IS NOT NULL;

-- Ledger adjustments (admin credits and debits) and reversals, claimed like usage.
CREATE TABLE billing_invoice_txn_claims (
    ledger_txn_id uuid PRIMARY KEY REFERENCES billing_ledger_transactions (id),
    invoice_id    uuid NOT NULL REFERENCES billing_invoices (id)
);

-- Payments applied to an issued invoice; reference makes applying idempotent.
CREATE TABLE billing_invoice_payments (
    id           uuid PRIMARY KEY,
    invoice_id   uuid NOT NULL REFERENCES billing_invoices (id),
    reference    text NOT NULL UNIQUE CHECK (char_length(reference) BETWEEN 1 AND 300),
    amount_minor bigint NOT NULL CHECK (amount_minor > 0),
    payment_id   uuid,
    created_at   timestamptz NOT NULL
);
CREATE INDEX billing_invoice_payments_invoice_idx ON billing_invoice_payments (invoice_id);

-- Every status change, in order (the invoice's history).
CREATE TABLE billing_invoice_transitions (
    id          uuid PRIMARY KEY,
    invoice_id  uuid NOT NULL REFERENCES billing_invoices (id),
    from_status text,
    to_status   text NOT NULL,
    event       text NOT NULL,
    actor_user_id uuid,
    created_at  timestamptz NOT NULL
);
CREATE INDEX billing_invoice_transitions_invoice_idx ON billing_invoice_transitions (invoice_id, created_at);

-- Lines of an invoice that left draft never change, and neither do its amounts, tax
-- fields, period or number. Inserts are checked once per statement (a close writes all
-- of a draft's lines in one), updates and deletes per row.
-- +goose StatementBegin
CREATE FUNCTION billing_invoice_lines_frozen() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE st text;
BEGIN
    SELECT status INTO st FROM billing_invoices WHERE id = OLD.invoice_id;
    IF st IS DISTINCT FROM 'draft' THEN
        RAISE EXCEPTION 'lines of a % invoice are immutable: % refused', st, TG_OP
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN COALESCE(NEW, OLD);
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER billing_invoice_lines_frozen BEFORE UPDATE OR DELETE ON billing_invoice_lines
    FOR EACH ROW EXECUTE FUNCTION billing_invoice_lines_frozen();

-- +goose StatementBegin
CREATE FUNCTION billing_invoice_lines_added() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM added a JOIN billing_invoices i ON i.id = a.invoice_id WHERE i.status <> 'draft') THEN
        RAISE EXCEPTION 'lines cannot be added to an invoice that left draft'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER billing_invoice_lines_added AFTER INSERT ON billing_invoice_lines
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION billing_invoice_lines_added();

-- +goose StatementBegin
CREATE FUNCTION billing_invoices_frozen() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF OLD.status <> 'draft' THEN
            RAISE EXCEPTION 'a % invoice cannot be deleted', OLD.status USING ERRCODE = 'insufficient_privilege';
        END IF;
        RETURN OLD;
    END IF;
    IF OLD.status <> 'draft' AND (
        NEW.subtotal_minor, NEW.tax_total_minor, NEW.credits_minor, NEW.total_minor, NEW.prepaid_minor, NEW.received_minor,
        NEW.tenant_id, NEW.currency, NEW.period_start, NEW.period_end, NEW.seller_key,
        NEW.tax_treatment, NEW.tax_jurisdiction, NEW.seller_tax_registration, NEW.customer_tax_registration,
        NEW.tax_snapshot, NEW.sequence_number, NEW.number, NEW.issued_at, NEW.due_at
    ) IS DISTINCT FROM (
        OLD.subtotal_minor, OLD.tax_total_minor, OLD.credits_minor, OLD.total_minor, OLD.prepaid_minor, OLD.received_minor,
        OLD.tenant_id, OLD.currency, OLD.period_start, OLD.period_end, OLD.seller_key,
        OLD.tax_treatment, OLD.tax_jurisdiction, OLD.seller_tax_registration, OLD.customer_tax_registration,
        OLD.tax_snapshot, OLD.sequence_number, OLD.number, OLD.issued_at, OLD.due_at
    ) THEN
        RAISE EXCEPTION 'a % invoice is immutable', OLD.status USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER billing_invoices_frozen BEFORE UPDATE OR DELETE ON billing_invoices
    FOR EACH ROW EXECUTE FUNCTION billing_invoices_frozen();

-- +goose Down
DROP TABLE billing_invoice_transitions;
DROP TABLE billing_invoice_payments;
DROP TABLE billing_invoice_txn_claims;
DROP TABLE billing_invoice_lines;
DROP TABLE billing_invoices;
DROP TABLE billing_invoice_sequences;
DROP FUNCTION billing_invoices_frozen();
DROP FUNCTION billing_invoice_lines_frozen();
DROP FUNCTION billing_invoice_lines_added();
