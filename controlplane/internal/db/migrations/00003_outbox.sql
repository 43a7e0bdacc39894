-- Transactional outbox (ARCHITECTURE §4): events are inserted in the transaction of the
-- change that causes them and published to JetStream by the relay.

-- +goose Up
CREATE TABLE outbox_events (
    id           uuid PRIMARY KEY,
    event_type   text NOT NULL CHECK (char_length(event_type) BETWEEN 1 AND 128),
    subject      text NOT NULL CHECK (char_length(subject) BETWEEN 1 AND 255),
    payload      jsonb NOT NULL,
    headers      jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at   timestamptz NOT NULL,
    published_at timestamptz,
    attempts     integer NOT NULL DEFAULT 0,
    last_error   text
);
CREATE INDEX outbox_events_pending_idx ON outbox_events (created_at, id) WHERE published_at IS NULL;

-- +goose StatementBegin
CREATE FUNCTION outbox_events_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_events', '');
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_events_notify
    AFTER INSERT ON outbox_events
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_events_notify();

-- +goose Down
DROP TABLE outbox_events;
DROP FUNCTION outbox_events_notify();
