-- Identity and tenancy core: tenants (organizations), users, platform role bindings,
-- departments, projects and project membership. Auth and tenancy both build on these.

-- +goose Up
CREATE TABLE tenants (
    id               uuid PRIMARY KEY,
    name             text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 120),
    slug             text NOT NULL UNIQUE CHECK (slug ~ '^[a-z0-9][a-z0-9-]{1,62}$'),
    kind             text NOT NULL CHECK (kind IN ('organization', 'personal')),
    default_currency text NOT NULL DEFAULT 'USD' CHECK (default_currency ~ '^[A-Z]{3}$'),
    status           text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'disabled')),
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL
);

CREATE TABLE users (
    id            uuid PRIMARY KEY,
    username      text NOT NULL UNIQUE CHECK (char_length(username) BETWEEN 3 AND 64),
    display_name  text NOT NULL CHECK (char_length(display_name) BETWEEN 1 AND 120),
    -- NULL: the user cannot sign in with a password (federated or machine identity).
    password_hash text,
    -- users.role = 'admin' makes a platform superadmin (platform_role_source users_role).
    role          text NOT NULL DEFAULT 'user' CHECK (role IN ('user', 'admin')),
    tenant_id     uuid REFERENCES tenants (id),
    tenant_role   text CHECK (tenant_role IN ('admin', 'member')),
    status        text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'disabled')),
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    CHECK ((tenant_id IS NULL) = (tenant_role IS NULL))
);
CREATE INDEX users_tenant_idx ON users (tenant_id, id);

CREATE TABLE platform_role_bindings (
    user_id    uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    role       text NOT NULL CHECK (role IN ('platform_superadmin', 'platform_ops', 'platform_user')),
    created_at timestamptz NOT NULL,
    PRIMARY KEY (user_id, role)
);

CREATE TABLE departments (
    id              uuid PRIMARY KEY,
    tenant_id       uuid NOT NULL REFERENCES tenants (id),
    display_name    text NOT NULL CHECK (char_length(display_name) BETWEEN 1 AND 120),
    slug            text NOT NULL CHECK (slug ~ '^[a-z0-9][a-z0-9-]{1,62}$'),
    is_default      boolean NOT NULL DEFAULT false,
    lifecycle_state text NOT NULL DEFAULT 'active' CHECK (lifecycle_state IN ('active', 'disabled')),
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    UNIQUE (tenant_id, slug),
    UNIQUE (tenant_id, id)
);
CREATE UNIQUE INDEX departments_one_default ON departments (tenant_id) WHERE is_default;

CREATE TABLE projects (
    id            uuid PRIMARY KEY,
    tenant_id     uuid NOT NULL REFERENCES tenants (id),
    department_id uuid NOT NULL,
    name          text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 120),
    slug          text NOT NULL CHECK (slug ~ '^[a-z0-9][a-z0-9-]{1,62}$'),
    is_default    boolean NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    UNIQUE (tenant_id, slug),
    -- A project's department must belong to the same tenant.
    FOREIGN KEY (tenant_id, department_id) REFERENCES departments (tenant_id, id)
);
CREATE UNIQUE INDEX projects_one_default ON projects (tenant_id) WHERE is_default;

CREATE TABLE project_members (
    project_id uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    user_id    uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    role       text NOT NULL CHECK (role IN ('owner', 'admin', 'member', 'viewer')),
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (project_id, user_id)
);
CREATE INDEX project_members_user_idx ON project_members (user_id);

-- +goose Down
DROP TABLE project_members;
DROP TABLE projects;
DROP TABLE departments;
DROP TABLE platform_role_bindings;
DROP TABLE users;
DROP TABLE tenants;
