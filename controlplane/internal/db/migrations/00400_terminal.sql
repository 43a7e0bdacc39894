-- +goose Up
-- Browser terminal (docs/terminal.md): single-use tokens that open a WebSocket terminal
-- into an allocation, and the terminal sessions those WebSockets attach to. Allocation
-- and user rows are referred to by id only (features talk through Go interfaces).

-- A session is one PTY on the node. It is created by its first attachment and lives
-- until it ends (the shell exits, the user closes it, the allocation goes away, or
-- nobody reattaches within the detach grace). The state machine is terminal/state.go.
CREATE TABLE terminal_sessions (
    id            uuid PRIMARY KEY,
    tenant_id     uuid NOT NULL,
    project_id    uuid NOT NULL,
    allocation_id uuid NOT NULL,
    node_id       uuid NOT NULL,
    user_id       uuid NOT NULL,
    status        text NOT NULL CHECK (status IN ('attached', 'detached', 'ended')),
    -- Bumped by every attachment; a bridge only changes the row while it holds the
    -- latest attachment, so a replaced WebSocket cannot detach its successor.
    attachment    integer NOT NULL CHECK (attachment >= 1),
    cols          integer NOT NULL CHECK (cols BETWEEN 1 AND 1000),
    rows          integer NOT NULL CHECK (rows BETWEEN 1 AND 1000),
    started_at    timestamptz NOT NULL,
    attached_at   timestamptz NOT NULL,
    detached_at   timestamptz,
    ended_at      timestamptz,
    ended_by      text CHECK (ended_by IN ('exit', 'client_closed', 'released', 'allocation_inactive',
                      'idle_timeout', 'agent_shutdown', 'error')),
    exit_code     integer,
    CHECK ((status = 'ended') = (ended_at IS NOT NULL AND ended_by IS NOT NULL)),
    CHECK (status <> 'detached' OR detached_at IS NOT NULL)
);

CREATE INDEX terminal_sessions_allocation_idx ON terminal_sessions (allocation_id) WHERE status <> 'ended';
-- Detached sessions past the grace are ended as idle_timeout by the sweep.
CREATE INDEX terminal_sessions_detached_idx ON terminal_sessions (detached_at) WHERE status = 'detached';

-- A token is stored only as the SHA-256 of its secret. consumed_at is set by the one
-- consume that wins (UPDATE ... WHERE consumed_at IS NULL).
CREATE TABLE terminal_tokens (
    id            uuid PRIMARY KEY,
    token_hash    bytea NOT NULL CHECK (octet_length(token_hash) = 32),
    user_id       uuid NOT NULL,
    tenant_id     uuid NOT NULL,
    project_id    uuid NOT NULL,
    allocation_id uuid NOT NULL,
    -- The session the token opens: a fresh id, or the detached session to reattach to.
    session_id    uuid NOT NULL,
    reattach      boolean NOT NULL,
    cols          integer NOT NULL CHECK (cols BETWEEN 1 AND 1000),
    rows          integer NOT NULL CHECK (rows BETWEEN 1 AND 1000),
    created_at    timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL,
    consumed_at   timestamptz,
    CONSTRAINT terminal_tokens_hash_key UNIQUE (token_hash)
);

CREATE INDEX terminal_tokens_expires_idx ON terminal_tokens (expires_at);

-- +goose Down
DROP TABLE terminal_tokens;
DROP TABLE terminal_sessions;
