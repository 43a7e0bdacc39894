-- Billing accounts in full (issue 24, docs/billing-accounts.md): reseller and end-customer
-- accounts, the tax profile and invoice settings of every account, and the second
-- (wholesale) rating of an end customer's usage for its reseller.

-- +goose Up
ALTER TABLE billing_accounts
    ADD COLUMN name                        text CHECK (char_length(name) BETWEEN 1 AND 120),
    ADD COLUMN parent_billing_account_id   uuid REFERENCES billing_accounts (id),
    ADD COLUMN reseller_tenant_id          uuid REFERENCES tenants (id),
    ADD COLUMN invoice_recipient_tenant_id uuid REFERENCES tenants (id),
    ADD COLUMN default_currency            text REFERENCES billing_currencies (code),
    ADD COLUMN wholesale_pricing_plan_id   uuid REFERENCES billing_pricing_plans (id),
    ADD COLUMN tax_responsibility          text NOT NULL DEFAULT 'platform'
        CHECK (tax_responsibility IN ('platform', 'reseller', 'end_customer')),
    ADD COLUMN credit_risk_owner           text NOT NULL DEFAULT 'platform'
        CHECK (credit_risk_owner IN ('platform', 'reseller')),
    -- Tax profile.
    ADD COLUMN tax_treatment               text NOT NULL DEFAULT 'not_configured'
        CHECK (tax_treatment IN ('not_configured', 'standard', 'tax_exempt', 'reverse_charge')),
    ADD COLUMN tax_jurisdiction            text CHECK (char_length(tax_jurisdiction) BETWEEN 2 AND 64),
    ADD COLUMN seller_tax_registration     text CHECK (char_length(seller_tax_registration) BETWEEN 1 AND 128),
    ADD COLUMN customer_tax_registration   text CHECK (char_length(customer_tax_registration) BETWEEN 1 AND 128),
    -- [{"tax_category": "compute", "tax_rate_bps": 1900}, ...]
    ADD COLUMN tax_rates                   jsonb NOT NULL DEFAULT '[]',
    ADD COLUMN default_tax_rate_bps        integer CHECK (default_tax_rate_bps BETWEEN 0 AND 10000),
    ADD COLUMN tax_exempt_reason           text CHECK (char_length(tax_exempt_reason) BETWEEN 1 AND 1024),
    ADD COLUMN tax_evidence                jsonb NOT NULL DEFAULT '{}',
    -- Invoice settings.
    ADD COLUMN invoice_currency            text REFERENCES billing_currencies (code),
    ADD COLUMN invoice_period              text NOT NULL DEFAULT 'monthly' CHECK (invoice_period IN ('monthly')),
    ADD COLUMN payment_terms_days          integer NOT NULL DEFAULT 30 CHECK (payment_terms_days BETWEEN 0 AND 365),
    -- An end customer (and only it) has a parent reseller account and a reseller tenant;
    -- only an end customer is rated at a wholesale plan.
    ADD CONSTRAINT billing_accounts_end_customer_parent
        CHECK ((account_type = 'end_customer') = (parent_billing_account_id IS NOT NULL)
           AND (account_type = 'end_customer') = (reseller_tenant_id IS NOT NULL)),
    ADD CONSTRAINT billing_accounts_wholesale_only_end_customer
        CHECK (wholesale_pricing_plan_id IS NULL OR account_type = 'end_customer'),
    ADD CONSTRAINT billing_accounts_not_own_reseller CHECK (reseller_tenant_id IS DISTINCT FROM tenant_id);
CREATE INDEX billing_accounts_reseller_idx ON billing_accounts (reseller_tenant_id) WHERE reseller_tenant_id IS NOT NULL;
CREATE INDEX billing_accounts_created_idx ON billing_accounts (created_at, id);

-- The wholesale rating of an end customer's run (its own segments: the wholesale plan
-- has its own versions), continued like the customer rating's seg_* columns.
ALTER TABLE billing_usage_records
    ADD COLUMN ws_rated_through     timestamptz,
    ADD COLUMN ws_seg_from          timestamptz,
    ADD COLUMN ws_seg_units         bigint NOT NULL DEFAULT 0,
    ADD COLUMN ws_seg_amount_minor  bigint NOT NULL DEFAULT 0;

-- Which price a rated line carries: the customer's (the tenant's own usage) or the
-- wholesale price a reseller pays for its end customer's usage.
ALTER TABLE billing_rated_usage_lines
    ADD COLUMN rating_role text NOT NULL DEFAULT 'customer' CHECK (rating_role IN ('customer', 'wholesale'));

-- +goose Down
ALTER TABLE billing_rated_usage_lines DROP COLUMN rating_role;
ALTER TABLE billing_usage_records
    DROP COLUMN ws_rated_through, DROP COLUMN ws_seg_from, DROP COLUMN ws_seg_units, DROP COLUMN ws_seg_amount_minor;
DROP INDEX billing_accounts_created_idx;
DROP INDEX billing_accounts_reseller_idx;
ALTER TABLE billing_accounts
    DROP CONSTRAINT billing_accounts_end_customer_parent,
    DROP CONSTRAINT billing_accounts_wholesale_only_end_customer,
    DROP CONSTRAINT billing_accounts_not_own_reseller,
    DROP COLUMN name, DROP COLUMN parent_billing_account_id, DROP COLUMN reseller_tenant_id,
    DROP COLUMN invoice_recipient_tenant_id, DROP COLUMN default_currency, DROP COLUMN wholesale_pricing_plan_id,
    DROP COLUMN tax_responsibility, DROP COLUMN credit_risk_owner, DROP COLUMN tax_treatment,
    DROP COLUMN tax_jurisdiction, DROP COLUMN seller_tax_registration, DROP COLUMN customer_tax_registration,
    DROP COLUMN tax_rates, DROP COLUMN default_tax_rate_bps, DROP COLUMN tax_exempt_reason, DROP COLUMN tax_evidence,
    DROP COLUMN invoice_currency, DROP COLUMN invoice_period, DROP COLUMN payment_terms_days;
