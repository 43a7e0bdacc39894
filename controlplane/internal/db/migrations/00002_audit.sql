-- Append-only audit log (ARCHITECTURE §4, seed §6.2). The database itself refuses
-- UPDATE, DELETE and TRUNCATE, whichever role asks.

-- +goose Up
CREATE TABLE audit_events (
    id             uuid PRIMARY KEY,
    occurred_at    timestamptz NOT NULL,
    actor_type     text NOT NULL CHECK (actor_type IN ('user', 'service', 'system', 'node')),
    actor_user_id  uuid,
    tenant_id      uuid,
    project_id     uuid,
    action         text NOT NULL CHECK (char_length(action) BETWEEN 1 AND 128),
    target_type    text NOT NULL CHECK (char_length(target_type) BETWEEN 1 AND 64),
    target_id      text,
    result         text NOT NULL CHECK (result IN ('success', 'failure')),
    correlation_id text NOT NULL,
    metadata       jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX audit_events_occurred_idx ON audit_events (occurred_at, id);
CREATE INDEX audit_events_action_idx ON audit_events (action, id);
CREATE INDEX audit_events_tenant_idx ON audit_events (tenant_id, occurred_at);

-- +goose StatementBegin
CREATE FUNCTION audit_events_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_events is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER audit_events_no_update_delete
    BEFORE UPDATE OR DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_events_append_only();
CREATE TRIGGER audit_events_no_truncate
    BEFORE TRUNCATE ON audit_events
    FOR EACH STATEMENT EXECUTE FUNCTION audit_events_append_only();
REVOKE UPDATE, DELETE, TRUNCATE ON audit_events FROM PUBLIC;

-- +goose Down
DROP TABLE audit_events;
DROP FUNCTION audit_events_append_only();
