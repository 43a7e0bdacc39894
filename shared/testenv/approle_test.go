package testenv

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// approle's databases are handed out as a role of their own that may read and append
// but not delete, the way a program's application role is.
var approle = Template{
	Name:    "testenv_approle",
	Version: "v1",
	AppRole: "testenv_app",
	Migrate: func(ctx context.Context, url string) error {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, `CREATE TABLE notes (id int PRIMARY KEY)`)
		if err != nil {
			return err
		}
		_, err = conn.Exec(ctx, `DO $$ BEGIN
			IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'testenv_app') THEN CREATE ROLE testenv_app LOGIN; END IF;
			EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
		END $$`)
		if err != nil {
			return err
		}
		_, err = conn.Exec(ctx, `GRANT SELECT, INSERT ON notes TO testenv_app`)
		return err
	},
}

func TestAppRoleDatabases(t *testing.T) {
	ctx := context.Background()
	pool := NewDatabase(t, approle)
	var user, dbName string
	if err := pool.QueryRow(ctx, `SELECT current_user, current_database()`).Scan(&user, &dbName); err != nil || user != "testenv_app" {
		t.Fatalf("NewDatabase logs in as %q (%v), want testenv_app", user, err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO notes VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	var pgErr *pgconn.PgError
	if _, err := pool.Exec(ctx, `DELETE FROM notes`); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Fatalf("DELETE as the app role: %v, want 42501", err)
	}

	owner, err := pgx.Connect(ctx, OwnerURL(t, pool.Config().ConnString()))
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close(ctx)
	var ownerUser, ownerDB string
	if err := owner.QueryRow(ctx, `SELECT current_user, current_database()`).Scan(&ownerUser, &ownerDB); err != nil || ownerUser == "testenv_app" || ownerDB != dbName {
		t.Fatalf("OwnerURL logs in as %q on %q (%v), want the admin on %q", ownerUser, ownerDB, err, dbName)
	}
	if tag, err := owner.Exec(ctx, `DELETE FROM notes`); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("DELETE as the owner: %v %v", tag, err)
	}
}
