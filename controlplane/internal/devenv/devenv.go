package devenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/auth"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
	"github.com/gantry-gpu/gantry/shared/natsenv"
)

// Options tunes Start. Only Dir is needed.
type Options struct {
	// Dir holds everything make dev keeps between runs (".dev"); made absolute.
	Dir string
	// DatabaseURL overrides the DATABASE_URL environment variable.
	DatabaseURL string
	// MigrateDatabaseURL overrides GANTRY_MIGRATE_DATABASE_URL.
	MigrateDatabaseURL string
	// AppRole overrides GANTRY_APP_DATABASE_ROLE (db.AppRole when both are empty).
	AppRole string
	// NATSURL overrides the NATS_URL environment variable.
	NATSURL string
	// MasterKey overrides the GANTRY_MASTER_KEY environment variable; when both are
	// empty the key of secrets.env is used.
	MasterKey string
	// LocalPostgresURL is the local server tried when no DATABASE_URL is set
	// (pgcluster.DefaultURL when empty).
	LocalPostgresURL string
	// Notef receives one-line notes on what Start decided (nil: discarded).
	Notef func(format string, args ...any)
}

// Env is a resolved development environment.
type Env struct {
	Dir string // absolute
	// DatabaseURL is what the control plane logs in with: the application's database
	// role (docs/development.md, "Database roles").
	DatabaseURL string
	// MigrateDatabaseURL is the owner's: it ran the migrations.
	MigrateDatabaseURL string
	// AppRole is the application's database role.
	AppRole string
	NATSURL string
	// Postgres and NATS say where each came from, for the console.
	Postgres string
	NATS     string
	Secrets  Secrets
	// MasterKey is the key the control plane must run with: GANTRY_MASTER_KEY when set,
	// else Secrets.MasterKey.
	MasterKey string
	// SSHPublicKey is the path of a demo SSH public key (OpenSSH format) under Dir.
	SSHPublicKey string

	closers []func() error
}

// Start resolves PostgreSQL and NATS, starting throwaway ones where needed, applies the
// migrations and loads (or creates) the development secrets. Close the Env to stop what
// it started; on error nothing is left running.
func Start(ctx context.Context, opts Options) (_ *Env, err error) {
	if opts.Dir == "" {
		opts.Dir = ".dev"
	}
	note := opts.Notef
	if note == nil {
		note = func(string, ...any) {}
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	if err := ensureDir(dir); err != nil {
		return nil, err
	}
	e := &Env{Dir: dir}
	defer func() {
		if err != nil {
			_ = e.Close()
		}
	}()

	var generated []string
	if e.Secrets, generated, err = LoadSecrets(dir); err != nil {
		return nil, err
	}
	if len(generated) > 0 {
		note("generated %s in %s", strings.Join(generated, ", "), filepath.Join(opts.Dir, SecretsFile))
	}
	e.MasterKey = firstNonEmpty(opts.MasterKey, os.Getenv("GANTRY_MASTER_KEY"), e.Secrets.MasterKey)
	if e.SSHPublicKey, err = ensureSSHKey(dir); err != nil {
		return nil, err
	}

	ownDB, err := e.resolvePostgres(ctx, opts, note)
	if err != nil {
		return nil, err
	}
	e.AppRole = firstNonEmpty(opts.AppRole, os.Getenv("GANTRY_APP_DATABASE_ROLE"), db.AppRole)
	if err := db.MigrateFor(ctx, e.MigrateDatabaseURL, e.AppRole); err != nil {
		return nil, fmt.Errorf("migrate %s: %w", e.Postgres, err)
	}
	if err := e.resolveAppURL(ctx, opts); err != nil {
		return nil, err
	}
	if err := e.checkSigningKeys(ctx, ownDB, note); err != nil {
		return nil, err
	}
	if err := e.resolveNATS(opts, note); err != nil {
		return nil, err
	}
	return e, nil
}

// Close stops what Start started (embedded NATS, throwaway PostgreSQL), last first.
func (e *Env) Close() error {
	var errs []error
	for i := len(e.closers) - 1; i >= 0; i-- {
		errs = append(errs, e.closers[i]())
	}
	e.closers = nil
	return errors.Join(errs...)
}

func (e *Env) resolveNATS(opts Options, note func(string, ...any)) error {
	if u := firstNonEmpty(opts.NATSURL, os.Getenv("NATS_URL")); u != "" {
		if !natsenv.Reachable(u) {
			return fmt.Errorf("NATS_URL %s does not answer", u)
		}
		if !natsenv.HasJetStream(u) {
			note("NATS at NATS_URL has no JetStream: the outbox relay will not be able to publish")
		}
		e.NATSURL, e.NATS = u, "NATS_URL"
		return nil
	}
	store := filepath.Join(e.Dir, "nats")
	srv, err := natsenv.Embedded(store)
	if err != nil {
		return fmt.Errorf("embedded NATS in %s: %w", store, err)
	}
	e.closers = append(e.closers, func() error { srv.Shutdown(); return nil })
	e.NATSURL, e.NATS = srv.URL(), "embedded nats-server with JetStream ("+e.rel(store)+")"
	return nil
}

// checkSigningKeys makes sure the control plane will be able to decrypt its active
// signing key with MasterKey. When it cannot (secrets.env was deleted, so the key is
// new) and the database is make dev's own, the unreadable key is retired so the control
// plane mints a new one; tokens it signed stop verifying, which in development is fine.
// On a database named by DATABASE_URL nothing is changed and the mismatch is an error.
// It runs as the owner (a repair, not the application's work).
func (e *Env) checkSigningKeys(ctx context.Context, ownDB bool, note func(string, ...any)) error {
	mk, err := auth.ParseMasterKey(e.MasterKey)
	if err != nil {
		return err
	}
	cfg := auth.DefaultConfig()
	cfg.MasterKey = mk
	pcfg, err := pgxpool.ParseConfig(e.MigrateDatabaseURL)
	if err != nil {
		return err
	}
	db.ConfigurePool(pcfg)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	ring, err := auth.NewKeyring(pool, cfg, clock.Real{}, ids.V7{})
	if err != nil {
		return err
	}
	err = ring.Reload(ctx)
	if err == nil || !strings.Contains(err.Error(), "GANTRY_MASTER_KEY") {
		return err
	}
	if !ownDB {
		return fmt.Errorf("%w: the database at DATABASE_URL was set up with another master key; set GANTRY_MASTER_KEY to it", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE auth_signing_keys SET state = 'retired', retired_at = now(), expires_at = now() WHERE state = 'active'`); err != nil {
		return fmt.Errorf("retire unreadable signing key: %w", err)
	}
	note("the active signing key was encrypted with another master key (was secrets.env deleted?): retired it; a new one is created")
	return nil
}

// resolveAppURL sets DatabaseURL, the application role's: DATABASE_URL when the owner's
// came from GANTRY_MIGRATE_DATABASE_URL (production's pair of URLs); else the owner's
// URL logging in as the role without a password (trust authentication, as the local
// server and the throwaway cluster have). It checks that the URL logs in as a role that
// cannot bypass the append-only tables' triggers.
func (e *Env) resolveAppURL(ctx context.Context, opts Options) error {
	if firstNonEmpty(opts.MigrateDatabaseURL, os.Getenv("GANTRY_MIGRATE_DATABASE_URL")) != "" {
		e.DatabaseURL = firstNonEmpty(opts.DatabaseURL, os.Getenv("DATABASE_URL"))
	}
	if e.DatabaseURL == "" {
		u, err := db.AppURL(e.MigrateDatabaseURL, e.AppRole)
		if err != nil {
			return err
		}
		e.DatabaseURL = u
	}
	conn, err := pgx.Connect(ctx, e.DatabaseURL)
	if err != nil {
		return fmt.Errorf("log in as the application role %s: %w", e.AppRole, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := db.CheckSessionRole(ctx, conn); err != nil {
		return fmt.Errorf("the control plane's database URL: %w", err)
	}
	return nil
}

// rel is p relative to the working directory when it lies below it.
func (e *Env) rel(p string) string {
	if wd, err := os.Getwd(); err == nil {
		if r, err := filepath.Rel(wd, p); err == nil && !strings.HasPrefix(r, "..") {
			return r
		}
	}
	return p
}

func ensureDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	return nil
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
