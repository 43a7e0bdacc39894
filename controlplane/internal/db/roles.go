package db

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3"
)

// Two database roles (docs/development.md, "Database roles"). The owner runs the
// migrations and owns every table, function and trigger; the control plane itself logs
// in as the application role, which owns nothing and may not bypass triggers, and to
// which UPDATE, DELETE and TRUNCATE of the append-only tables are never granted.
//
// Why: the append-only tables (audit_events, the billing ledger) refuse changes through
// triggers, and a table's owner can switch its triggers off (ALTER TABLE ... DISABLE
// TRIGGER, or SET session_replication_role = replica as a superuser). The application
// role can do neither: it is not the owner, and setting session_replication_role needs
// superuser (SQLSTATE 42501). Without the privileges the statement is refused before any
// trigger runs, so the guarantee no longer rests on the triggers alone.

// AppRole is the application's database role unless GANTRY_APP_DATABASE_ROLE names
// another. Roles belong to the whole PostgreSQL cluster, not to one database: every
// database of the cluster migrated for Gantry grants to the same role, in that database
// only.
const AppRole = "gantry_app"

// grantsRevision is part of SchemaVersion: change it whenever GrantApp grants otherwise,
// so test templates (which keep their privileges) are rebuilt.
const grantsRevision = "app-role-1"

// appendOnlySuffix names the trigger functions that make a table append-only
// (audit_events_append_only, billing_append_only): a table with a trigger calling one is
// append-only, and GrantApp withholds UPDATE, DELETE and TRUNCATE on it. A migration that
// adds an append-only table follows the convention and is covered without more.
const appendOnlySuffix = "_append_only"

// ErrPrivilegedRole says a role can bypass the append-only guarantee.
var ErrPrivilegedRole = errors.New("database role can bypass the append-only tables' triggers")

// GrantApp makes role the application role of the database conn is connected to, as its
// owner: it creates the role when the cluster has none of that name (LOGIN, no password:
// set one for password authentication, see docs/development.md), refuses a role that
// could bypass triggers, and grants it what the control plane needs — SELECT, INSERT,
// UPDATE, DELETE on every table of the schema and the use of every sequence — less
// UPDATE, DELETE and TRUNCATE on the append-only tables. It is idempotent and runs after
// every migration (Migrate), so tables that later migrations add are granted too.
func GrantApp(ctx context.Context, conn *pgx.Conn, role string) error {
	if role == "" {
		return errors.New("app role: empty name")
	}
	r := pgx.Identifier{role}.Sanitize()
	var owner string
	if err := conn.QueryRow(ctx, `SELECT current_user`).Scan(&owner); err != nil {
		return fmt.Errorf("app role: %w", err)
	}
	if owner == role {
		return fmt.Errorf("app role %q is the role that runs the migrations (the owner): the application must log in as another (GANTRY_APP_DATABASE_ROLE, docs/development.md)", role)
	}
	if err := createRole(ctx, conn, role); err != nil {
		return err
	}
	if err := CheckRole(ctx, conn, role); err != nil {
		return fmt.Errorf("app role %q: %w", role, err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer Rollback(ctx, tx)
	var dbName string
	if err := tx.QueryRow(ctx, `SELECT current_database()`).Scan(&dbName); err != nil {
		return err
	}
	stmts := []string{
		`GRANT CONNECT ON DATABASE ` + pgx.Identifier{dbName}.Sanitize() + ` TO ` + r,
		`GRANT USAGE ON SCHEMA public TO ` + r,
		`REVOKE ALL ON ALL TABLES IN SCHEMA public FROM ` + r,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO ` + r,
		`GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO ` + r,
	}
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("app role: %s: %w", s, err)
		}
	}
	// The migration bookkeeping is the owner's: the application reads nothing there.
	if _, err := tx.Exec(ctx, `REVOKE ALL ON TABLE `+pgx.Identifier{goose.DefaultTablename}.Sanitize()+` FROM `+r); err != nil {
		return fmt.Errorf("app role: %w", err)
	}
	tables, err := AppendOnlyTables(ctx, tx)
	if err != nil {
		return err
	}
	for _, t := range tables {
		s := `REVOKE UPDATE, DELETE, TRUNCATE ON ` + pgx.Identifier{t}.Sanitize() + ` FROM ` + r
		if _, err := tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("app role: %s: %w", s, err)
		}
	}
	return tx.Commit(ctx)
}

// createRole creates role unless it exists. Databases of one cluster are migrated
// concurrently (tests, replicas), and CREATE ROLE has no IF NOT EXISTS: a concurrent
// creation is not an error.
func createRole(ctx context.Context, conn *pgx.Conn, role string) error {
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)`, role).Scan(&exists); err != nil {
		return fmt.Errorf("app role: %w", err)
	}
	if exists {
		return nil
	}
	_, err := conn.Exec(ctx, `CREATE ROLE `+pgx.Identifier{role}.Sanitize()+
		` LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS`)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42710" || pgErr.Code == "23505") { // duplicate_object, or the catalog's unique index
		return nil
	}
	if err != nil {
		return fmt.Errorf("create app role %q (the migrating role needs CREATEROLE, or create it beforehand: docs/development.md): %w", role, err)
	}
	return nil
}

// CheckRole refuses role when it could bypass the append-only guarantee: a superuser, a
// role with REPLICATION or BYPASSRLS, or one that is (or may become, through membership)
// the owner of a table of the schema.
func CheckRole(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, role string) error {
	var super, repl, bypass, owns bool
	err := q.QueryRow(ctx, `
		SELECT r.rolsuper, r.rolreplication, r.rolbypassrls,
		       EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		               WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
		                 AND pg_has_role(r.oid, c.relowner, 'MEMBER'))
		FROM pg_roles r WHERE r.rolname = $1`, role).Scan(&super, &repl, &bypass, &owns)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("role %q does not exist", role)
	}
	if err != nil {
		return err
	}
	var why []string
	if super {
		why = append(why, "superuser")
	}
	if repl {
		why = append(why, "REPLICATION")
	}
	if bypass {
		why = append(why, "BYPASSRLS")
	}
	if owns {
		why = append(why, "owner (or member of the owner) of the schema's tables")
	}
	if len(why) > 0 {
		return fmt.Errorf("%w: %q is %s", ErrPrivilegedRole, role, strings.Join(why, ", "))
	}
	return nil
}

// CheckSessionRole is CheckRole for the role the pool's connections log in as (the
// control plane checks its own at start).
func CheckSessionRole(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (string, error) {
	var role string
	if err := q.QueryRow(ctx, `SELECT session_user`).Scan(&role); err != nil {
		return "", err
	}
	return role, CheckRole(ctx, q, role)
}

// AppendOnlyTables are the tables of the schema with a trigger calling a *_append_only
// function, sorted.
func AppendOnlyTables(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) ([]string, error) {
	rows, err := q.Query(ctx, `
		SELECT DISTINCT c.relname
		FROM pg_trigger t
		JOIN pg_class c ON c.oid = t.tgrelid
		JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_proc p ON p.oid = t.tgfoid
		WHERE n.nspname = 'public' AND NOT t.tgisinternal AND p.proname LIKE '%' || $1
		ORDER BY c.relname`, appendOnlySuffix)
	if err != nil {
		return nil, fmt.Errorf("append-only tables: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// AppURL is ownerURL (a postgres:// URL) logging in as role without a password: what
// make dev and the tests use on servers with trust authentication for local
// connections. In production DATABASE_URL names the role and its password directly.
func AppURL(ownerURL, role string) (string, error) {
	u, err := url.Parse(ownerURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("%q is not a postgres:// URL", ownerURL)
	}
	u.User = url.User(role)
	return u.String(), nil
}
