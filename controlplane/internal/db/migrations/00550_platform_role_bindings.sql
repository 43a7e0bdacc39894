-- Platform roles come from bindings only (issue 19 item 4; docs/api.md "Platform roles").
-- Until now users.role = 'admin' made a superadmin (platform_role_source users_role); the
-- admins it named become platform_superadmin bindings here, and a binding records who
-- granted it. created_at is the grant time (granted_at in the API).
--
-- users.role stays as the User.role field of the contract: the bind and revoke
-- operations keep it in step with the superadmin binding, and a writer that still sets
-- users.role = 'admin' directly (operator seeding, older tooling) gets the binding from
-- the trigger below, so no superadmin exists outside the bindings.

-- +goose Up
ALTER TABLE platform_role_bindings
    ADD COLUMN granted_by uuid REFERENCES users (id) ON DELETE SET NULL;

INSERT INTO platform_role_bindings (user_id, role, created_at)
SELECT id, 'platform_superadmin', updated_at FROM users WHERE role = 'admin'
ON CONFLICT (user_id, role) DO NOTHING;

-- +goose StatementBegin
CREATE FUNCTION platform_role_bind_users_admin() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO platform_role_bindings (user_id, role, created_at)
    VALUES (NEW.id, 'platform_superadmin', NEW.updated_at)
    ON CONFLICT (user_id, role) DO NOTHING;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER users_admin_binding_insert AFTER INSERT ON users
    FOR EACH ROW WHEN (NEW.role = 'admin') EXECUTE FUNCTION platform_role_bind_users_admin();
CREATE TRIGGER users_admin_binding_update AFTER UPDATE OF role ON users
    FOR EACH ROW WHEN (NEW.role = 'admin' AND OLD.role <> 'admin') EXECUTE FUNCTION platform_role_bind_users_admin();

CREATE INDEX platform_role_bindings_role_idx ON platform_role_bindings (role, user_id);

-- +goose Down
DROP INDEX platform_role_bindings_role_idx;
DROP TRIGGER users_admin_binding_update ON users;
DROP TRIGGER users_admin_binding_insert ON users;
DROP FUNCTION platform_role_bind_users_admin();
ALTER TABLE platform_role_bindings DROP COLUMN granted_by;
