-- Budgets (docs/budgets.md): tenant- and project-scoped spending limits in one currency,
-- and the events their evaluation opens, deduplicated per period by threshold_key.

-- +goose Up
CREATE TABLE budgets (
    id                uuid PRIMARY KEY,
    tenant_id         uuid NOT NULL REFERENCES tenants (id),
    -- A project's budgets go with the project.
    project_id        uuid REFERENCES projects (id) ON DELETE CASCADE,
    scope_type        text NOT NULL CHECK (scope_type IN ('tenant', 'project')),
    name              text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 120),
    period            text NOT NULL CHECK (period IN ('monthly', 'quarterly', 'annual', 'custom')),
    amount_minor      bigint NOT NULL CHECK (amount_minor BETWEEN 1 AND 1000000000000000),
    currency          text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    threshold_percent integer NOT NULL CHECK (threshold_percent BETWEEN 1 AND 100),
    enforcement_mode  text NOT NULL CHECK (enforcement_mode IN ('notify_only', 'block_launch', 'suspend')),
    active            boolean NOT NULL DEFAULT true,
    starts_at         timestamptz NOT NULL,
    ends_at           timestamptz,
    created_by        uuid,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    CHECK ((scope_type = 'project') = (project_id IS NOT NULL)),
    CHECK (ends_at IS NULL OR ends_at > starts_at),
    CHECK (period <> 'custom' OR ends_at IS NOT NULL)
);
CREATE INDEX budgets_tenant_idx ON budgets (tenant_id, id);
CREATE INDEX budgets_project_idx ON budgets (project_id) WHERE project_id IS NOT NULL;
CREATE INDEX budgets_active_tenant_idx ON budgets (tenant_id) WHERE active;

CREATE TABLE budget_events (
    id                   uuid PRIMARY KEY,
    budget_id            uuid NOT NULL REFERENCES budgets (id) ON DELETE CASCADE,
    tenant_id            uuid NOT NULL,
    threshold_key        text NOT NULL CHECK (char_length(threshold_key) BETWEEN 1 AND 128),
    -- The level the key stands for: the budget's threshold_percent when it opened, or 100.
    level_percent        integer NOT NULL CHECK (level_percent BETWEEN 1 AND 100),
    period_start         timestamptz NOT NULL,
    period_end           timestamptz NOT NULL CHECK (period_end > period_start),
    -- The latest observation: spend and budget in the budget's currency, never converted.
    spent_minor          bigint NOT NULL,
    budget_minor         bigint NOT NULL CHECK (budget_minor > 0),
    currency             text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    percent_used         bigint NOT NULL,
    status               text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'acknowledged', 'resolved')),
    first_seen_at        timestamptz NOT NULL,
    last_seen_at         timestamptz NOT NULL CHECK (last_seen_at >= first_seen_at),
    seen_count           integer NOT NULL DEFAULT 1 CHECK (seen_count >= 1),
    correlation_id       text CHECK (char_length(correlation_id) <= 128),
    acknowledged_at      timestamptz,
    acknowledged_by      uuid,
    resolved_at          timestamptz,
    resolved_by          uuid,
    -- Set once, when a suspend budget's 100% event asked for running workloads to stop.
    suspend_requested_at timestamptz,
    UNIQUE (budget_id, period_start, threshold_key)
);
CREATE INDEX budget_events_latest_idx ON budget_events (budget_id, last_seen_at DESC, id DESC);
CREATE INDEX budget_events_tenant_idx ON budget_events (tenant_id, id);

-- +goose Down
DROP TABLE budget_events;
DROP TABLE budgets;
