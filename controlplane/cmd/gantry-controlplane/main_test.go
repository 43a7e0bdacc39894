package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// serve runs as the application's database role; the owner (who can switch the
// append-only triggers off) is refused unless explicitly allowed, and then logged.
func TestServeRefusesAPrivilegedDatabaseRole(t *testing.T) {
	ctx := context.Background()
	tmpl := testenv.Template{Name: "controlplane", Version: db.SchemaVersion(), Migrate: db.Migrate, Configure: db.ConfigurePool, AppRole: db.AppRole}
	app := testenv.NewDatabase(t, tmpl)
	owner, err := pgxpool.New(ctx, testenv.OwnerURL(t, app.Config().ConnString()))
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	if err := checkDatabaseRole(ctx, app, false, log); err != nil {
		t.Fatalf("the application role: %v", err)
	}
	if err := checkDatabaseRole(ctx, owner, false, log); !errors.Is(err, db.ErrPrivilegedRole) {
		t.Fatalf("the owner: %v, want ErrPrivilegedRole", err)
	}
	if logs.Len() != 0 {
		t.Fatalf("logged %q", logs.String())
	}
	if err := checkDatabaseRole(ctx, owner, true, log); err != nil || !strings.Contains(logs.String(), "GANTRY_ALLOW_PRIVILEGED_DATABASE_ROLE") {
		t.Fatalf("the owner, allowed: %v, log %q", err, logs.String())
	}
}
