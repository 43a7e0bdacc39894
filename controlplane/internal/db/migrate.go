package db

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"sort"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// riverRevision is part of SchemaVersion: River's own tables (background jobs,
// controlplane/internal/jobs) are migrated by the River release go.mod pins, so test
// templates are rebuilt when it changes.
const riverRevision = "river-v0.51.2"

//go:embed migrations/*.sql
var migrations embed.FS

// Migrate applies every pending migration to the database at url, logged in as the
// schema's owner, and grants the application role AppRole what it needs (GrantApp).
func Migrate(ctx context.Context, url string) error {
	return MigrateFor(ctx, url, AppRole)
}

// MigrateFor is Migrate granting to appRole (GANTRY_APP_DATABASE_ROLE).
func MigrateFor(ctx context.Context, url, appRole string) error {
	if err := migrateSchema(ctx, url); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("connect to grant the app role: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return GrantApp(ctx, conn, appRole)
}

func migrateSchema(ctx context.Context, url string) error {
	sqlDB, err := sql.Open("pgx", url)
	if err != nil {
		return fmt.Errorf("open for migrate: %w", err)
	}
	defer sqlDB.Close()
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, sub)
	if err != nil {
		return fmt.Errorf("migration provider: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate up: %w", err)
	}
	return migrateRiver(ctx, url)
}

// migrateRiver applies River's own migrations (its job, leader and queue tables) after
// ours: background jobs are inserted in the same transactions as our rows, so both live
// in the one database and are migrated by the one command.
func migrateRiver(ctx context.Context, url string) error {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return fmt.Errorf("open for river migrate: %w", err)
	}
	defer pool.Close()
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return fmt.Errorf("river migrator: %w", err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrate up: %w", err)
	}
	return nil
}

// SchemaVersion is a hash of every migration file and of what GrantApp grants, so test
// templates are rebuilt exactly when the schema or its privileges change.
func SchemaVersion() string {
	entries, _ := fs.ReadDir(migrations, "migrations")
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		b, _ := fs.ReadFile(migrations, "migrations/"+n)
		h.Write([]byte(n))
		h.Write(b)
	}
	h.Write([]byte(grantsRevision))
	h.Write([]byte(riverRevision))
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// Registers the pgx database/sql driver used by goose.
var _ = stdlib.GetDefaultDriver
