-- +goose Up
-- Alert routing evidence (docs/operations.md, "Monitoring"; issue 21).

-- A drill: a test alert fired through Alertmanager by an operator, standing in for
-- alert_name, expected at receiver (the route's destination). arrived_at is set when
-- the control plane's alert receiver gets it.
CREATE TABLE observability_drills (
    drill_id   uuid PRIMARY KEY,
    alert_name text NOT NULL CHECK (length(alert_name) BETWEEN 1 AND 128),
    receiver   text NOT NULL CHECK (length(receiver) BETWEEN 1 AND 256),
    fired_by   uuid REFERENCES users (id) ON DELETE SET NULL,
    fired_at   timestamptz NOT NULL,
    arrived_at timestamptz
);
CREATE INDEX observability_drills_receiver_idx ON observability_drills (receiver, fired_at DESC);

-- +goose Down
DROP TABLE observability_drills;
