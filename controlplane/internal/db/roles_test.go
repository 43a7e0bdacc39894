package db_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

// The append-only tables, as the migrations make them (a trigger calling a
// *_append_only function).
var appendOnly = []string{
	"audit_events", "billing_fx_snapshots", "billing_ledger_entries", "billing_ledger_transactions",
	"billing_prices", "billing_pricing_plan_versions", "billing_rated_usage_lines", "billing_rating_events",
}

func wantSQLState(t *testing.T, what string, err error, code string) *pgconn.PgError {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != code {
		t.Fatalf("%s: %v, want SQLSTATE %s", what, err, code)
	}
	return pgErr
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// The application's role cannot change an audit row, even trying the owner's way round
// the append-only trigger (issue 18 item 13): it may not set session_replication_role
// (42501: only a superuser may), may not disable the trigger (42501: only the owner
// may), and has no UPDATE, DELETE or TRUNCATE to begin with (42501 before any trigger
// runs). The owner, for contrast, does get round the trigger that way.
func TestAppRoleCannotBypassAppendOnly(t *testing.T) {
	ctx := context.Background()
	pool := testenv.NewDatabase(t, template)
	app := connect(t, pool.Config().ConnString())
	if _, err := app.Exec(ctx, `INSERT INTO audit_events (id, occurred_at, actor_type, action, target_type, result, correlation_id)
		VALUES (gen_random_uuid(), now(), 'system', 'test.row', 'test', 'success', 'c1')`); err != nil {
		t.Fatalf("the app role appends to the audit log: %v", err)
	}
	var who string
	if err := app.QueryRow(ctx, `SELECT current_user`).Scan(&who); err != nil || who != db.AppRole {
		t.Fatalf("connected as %q (%v), want %q", who, err, db.AppRole)
	}

	wantSQLState(t, "SET session_replication_role", func() error {
		_, err := app.Exec(ctx, `SET session_replication_role = replica`)
		return err
	}(), "42501")
	for _, stmt := range []string{
		`ALTER TABLE audit_events DISABLE TRIGGER ALL`,
		`ALTER TABLE audit_events DISABLE TRIGGER audit_events_no_update_delete`,
		`SET ROLE postgres`,
		`UPDATE audit_events SET action = 'tampered'`,
		`DELETE FROM audit_events`,
		`TRUNCATE audit_events`,
	} {
		_, err := app.Exec(ctx, stmt)
		e := wantSQLState(t, stmt, err, "42501")
		if strings.Contains(e.Message, "append-only") {
			t.Fatalf("%s: refused by the trigger (%s), not by the role's privileges", stmt, e.Message)
		}
	}
	// And inside a transaction that tried the setting first.
	tx, err := app.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, `SET LOCAL session_replication_role = replica`)
	wantSQLState(t, "SET LOCAL session_replication_role", err, "42501")
	_ = tx.Rollback(ctx)

	// Every append-only table, every change.
	for _, table := range appendOnly {
		var col string
		if err := app.QueryRow(ctx, `SELECT column_name FROM information_schema.columns WHERE table_name = $1 ORDER BY ordinal_position LIMIT 1`, table).Scan(&col); err != nil {
			t.Fatalf("%s: %v", table, err)
		}
		for _, stmt := range []string{"UPDATE " + table + " SET " + col + " = " + col, "DELETE FROM " + table, "TRUNCATE " + table} {
			_, err := app.Exec(ctx, stmt)
			wantSQLState(t, stmt, err, "42501")
		}
	}
	var n int
	if err := app.QueryRow(ctx, `SELECT count(*) FROM audit_events WHERE action = 'test.row'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("audit rows: %d %v", n, err)
	}

	// The owner (here a superuser, as on this machine) gets round the trigger with the
	// setting: the gap the application role closes.
	owner := connect(t, testenv.OwnerURL(t, pool.Config().ConnString()))
	if _, err := owner.Exec(ctx, `DELETE FROM audit_events`); err == nil || !strings.Contains(err.Error(), "append-only") {
		t.Fatalf("the owner's DELETE: %v, want the trigger's refusal", err)
	}
	if _, err := owner.Exec(ctx, `SET session_replication_role = replica`); err != nil {
		t.Fatalf("the owner sets session_replication_role: %v", err)
	}
	if tag, err := owner.Exec(ctx, `DELETE FROM audit_events WHERE action = 'test.row'`); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("the owner with session_replication_role = replica: %v %v, want the row deleted", tag, err)
	}
}

// The application role has what the control plane needs and nothing more, and it is
// checked: the owner is refused as an application role.
func TestAppRolePrivileges(t *testing.T) {
	ctx := context.Background()
	pool := testenv.NewDatabase(t, template)
	got, err := db.AppendOnlyTables(ctx, pool)
	if err != nil || !slices.Equal(got, appendOnly) {
		t.Fatalf("append-only tables: %v %v, want %v", got, err, appendOnly)
	}
	role, err := db.CheckSessionRole(ctx, pool)
	if err != nil || role != db.AppRole {
		t.Fatalf("the app pool's role %q: %v", role, err)
	}
	var super, repl, bypass, createRole, createDB bool
	if err := pool.QueryRow(ctx, `SELECT rolsuper, rolreplication, rolbypassrls, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = $1`, db.AppRole).
		Scan(&super, &repl, &bypass, &createRole, &createDB); err != nil || super || repl || bypass || createRole || createDB {
		t.Fatalf("app role attributes: super %v repl %v bypassrls %v createrole %v createdb %v (%v)", super, repl, bypass, createRole, createDB, err)
	}
	// Table by table: read and append everywhere; change and delete where not append-only;
	// truncate, trigger and references nowhere; nothing on the migration bookkeeping.
	rows, err := pool.Query(ctx, `SELECT c.relname,
		has_table_privilege(c.oid, 'SELECT'), has_table_privilege(c.oid, 'INSERT'),
		has_table_privilege(c.oid, 'UPDATE'), has_table_privilege(c.oid, 'DELETE'),
		has_table_privilege(c.oid, 'TRUNCATE'), has_table_privilege(c.oid, 'TRIGGER'), has_table_privilege(c.oid, 'REFERENCES')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') ORDER BY c.relname`)
	if err != nil {
		t.Fatal(err)
	}
	tables := 0
	for rows.Next() {
		var name string
		var sel, ins, upd, del, trunc, trig, ref bool
		if err := rows.Scan(&name, &sel, &ins, &upd, &del, &trunc, &trig, &ref); err != nil {
			t.Fatal(err)
		}
		tables++
		ao := slices.Contains(appendOnly, name)
		switch {
		case name == "goose_db_version":
			if sel || ins || upd || del || trunc {
				t.Errorf("%s: the app role has privileges on the migration bookkeeping", name)
			}
		case !sel || !ins || upd == ao || del == ao || trunc || trig || ref:
			t.Errorf("%s (append-only %v): select %v insert %v update %v delete %v truncate %v trigger %v references %v",
				name, ao, sel, ins, upd, del, trunc, trig, ref)
		}
	}
	if rows.Err() != nil || tables < 30 {
		t.Fatalf("%d tables read: %v", tables, rows.Err())
	}

	// GrantApp is idempotent, and refuses a role that could bypass the triggers.
	owner := connect(t, testenv.OwnerURL(t, pool.Config().ConnString()))
	if err := db.GrantApp(ctx, owner, db.AppRole); err != nil {
		t.Fatalf("grant again: %v", err)
	}
	var ownerName string
	if err := owner.QueryRow(ctx, `SELECT current_user`).Scan(&ownerName); err != nil {
		t.Fatal(err)
	}
	if err := db.GrantApp(ctx, owner, ownerName); err == nil {
		t.Fatal("the owner was accepted as the application role")
	}
	if _, err := db.CheckSessionRole(ctx, owner); !errors.Is(err, db.ErrPrivilegedRole) {
		t.Fatalf("the owner's session: %v, want ErrPrivilegedRole", err)
	}
}
