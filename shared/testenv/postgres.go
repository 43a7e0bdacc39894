package testenv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/shared/natsenv"
	"github.com/gantry-gpu/gantry/shared/pgcluster"
)

// misconfigured marks a failure that fails a test even outside CI: a variable
// that was set on purpose points at nothing usable.
type misconfigured struct{ error }

func fail(t testing.TB, err error) {
	t.Helper()
	var m misconfigured
	if errors.As(err, &m) {
		t.Fatalf("testenv: %v", err)
	}
	unavailable(t, "%v", err)
}

// The machine's default servers; variables so a run can point them elsewhere
// (go test -ldflags=-X) to exercise the throwaway fallbacks.
var (
	localPostgres = pgcluster.DefaultURL
	localNATS     = natsenv.DefaultURL
	localRedis    = "127.0.0.1:6379"
)

var postgres once[string]

// PostgresURL returns the URL of a PostgreSQL server's admin database for
// tests: TEST_DATABASE_URL when set; else postgres@127.0.0.1:5432/postgres when
// it answers; else a throwaway cluster started once per test process in a
// temporary directory (stopped and removed by Main). Tests should not use the
// admin database directly: use NewDatabase or DatabaseURL.
func PostgresURL(t testing.TB) string {
	t.Helper()
	u, err := postgres.get(findPostgres)
	if err != nil {
		fail(t, err)
	}
	return u
}

func findPostgres() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		if pu, err := url.Parse(u); err != nil || (pu.Scheme != "postgres" && pu.Scheme != "postgresql") {
			return "", misconfigured{errors.New("TEST_DATABASE_URL must be a postgres:// URL")}
		}
		if err := pgcluster.Ping(ctx, u); err != nil {
			return "", misconfigured{fmt.Errorf("TEST_DATABASE_URL is set but does not answer: %v", err)}
		}
		return u, nil
	}
	if u, ok := pgcluster.Discover(ctx, localPostgres); ok {
		return u, nil
	}
	dir, err := os.MkdirTemp("", "gantry-testenv-pg-")
	if err != nil {
		return "", err
	}
	c, err := pgcluster.Start(ctx, dir, pgcluster.Options{})
	if err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("no PostgreSQL: TEST_DATABASE_URL unset, nothing answers at the local default, and a throwaway cluster failed: %w", err)
	}
	onExit(func() {
		c.Stop()
		os.RemoveAll(dir)
	})
	return c.URL(), nil
}

// Template describes a migrated database that test databases are cloned from.
type Template struct {
	// Name identifies the schema, e.g. "controlplane".
	Name string
	// Version changes whenever the migrations do, e.g. VersionOf(migrationsFS).
	// Templates of other versions are left behind (harmless).
	Version string
	// Migrate brings the empty database at url to the schema. It must close
	// its connections before returning.
	Migrate func(ctx context.Context, url string) error
	// Configure, if set, adjusts the config of pools NewDatabase opens on the
	// template's clones, as the program configures its own (types it registers).
	Configure func(*pgxpool.Config)
	// AppRole, when set, is the role NewDatabase and DatabaseURL log in as: the
	// program's own database role, which Migrate creates and grants (it must be able
	// to log in without a password, as trust authentication on loopback allows, or
	// with TEST_APP_DATABASE_PASSWORD). Tests then run as the program does in
	// production, not as the owner of the schema; OwnerURL gives the owner. Empty:
	// the admin URL's role.
	AppRole string
}

// NewDatabase creates a private database cloned from tmpl (migrating the
// template first if no process has yet) and returns a pool on it. The pool is
// closed and the database dropped when the test ends. The database's URL is
// pool.Config().ConnString(); the pool logs in as tmpl.AppRole when it is set.
func NewDatabase(t testing.TB, tmpl Template) *pgxpool.Pool {
	t.Helper()
	u := DatabaseURL(t, tmpl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatalf("testenv: test database URL: %v", err)
	}
	if tmpl.Configure != nil {
		tmpl.Configure(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("testenv: open pool on test database: %v", err)
	}
	t.Cleanup(pool.Close) // runs before the DROP registered by DatabaseURL
	return pool
}

// DatabaseURL creates a private database cloned from tmpl, like NewDatabase,
// and returns its URL. The database is dropped when the test ends, forcibly
// closing connections still open on it.
func DatabaseURL(t testing.TB, tmpl Template) string {
	t.Helper()
	admin := PostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	tmplDB, err := ensureTemplate(ctx, admin, tmpl)
	if err != nil {
		t.Fatalf("testenv: template %q: %v", tmpl.Name, err)
	}
	name := "test_" + randomHex(t, 8)
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("testenv: connect to admin database: %v", err)
	}
	defer conn.Close(context.Background())
	create := "CREATE DATABASE " + ident(name) + " TEMPLATE " + ident(tmplDB)
	for attempt := 0; ; attempt++ {
		_, err = conn.Exec(ctx, create)
		// 55006 object_in_use: something is still connected to the template.
		var pgErr *pgconn.PgError
		if err == nil || attempt == 20 || !errors.As(err, &pgErr) || pgErr.Code != "55006" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("testenv: %s: %v", create, err)
	}
	t.Cleanup(func() { dropDatabase(t, admin, name) })
	u := withDatabase(admin, name)
	if tmpl.AppRole != "" {
		u = withUser(u, tmpl.AppRole, os.Getenv("TEST_APP_DATABASE_PASSWORD"))
	}
	return u
}

// OwnerURL is the URL of the test database dbURL (from NewDatabase or DatabaseURL)
// logged in as the admin URL's role, which owns the schema: for tests that must do
// what the program's role may not.
func OwnerURL(t testing.TB, dbURL string) string {
	t.Helper()
	pu, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("testenv: %q is not a URL", dbURL)
	}
	return withDatabase(PostgresURL(t), strings.TrimPrefix(pu.Path, "/"))
}

func dropDatabase(t testing.TB, admin, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err == nil {
		defer conn.Close(context.Background())
		_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(name)+" WITH (FORCE)")
	}
	if err != nil {
		t.Errorf("testenv: drop test database %s: %v", name, err)
	}
}

var (
	templatesMu sync.Mutex
	templates   = map[string]bool{} // template databases known ready, per admin URL
)

// ensureTemplate creates and migrates the template database once. Within the
// process a mutex serialises callers; across processes (go test runs packages
// in parallel) a session advisory lock on the admin connection does.
func ensureTemplate(ctx context.Context, admin string, tmpl Template) (string, error) {
	if tmpl.Name == "" || tmpl.Migrate == nil {
		return "", errors.New("Template needs a Name and a Migrate func")
	}
	name := templateName(tmpl)
	key := admin + "|" + name
	templatesMu.Lock()
	defer templatesMu.Unlock()
	if templates[key] {
		return name, nil
	}

	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", fmt.Errorf("connect to admin database: %w", err)
	}
	defer conn.Close(context.Background())
	lock := "gantry-testenv:" + name
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", lock); err != nil {
		return "", fmt.Errorf("advisory lock: %w", err)
	}
	defer conn.Exec(context.Background(), "SELECT pg_advisory_unlock(hashtext($1))", lock)

	// A template is complete once it is marked datistemplate; one that exists
	// without the mark is left over from a failed or interrupted migration.
	var exists, ready bool
	err = conn.QueryRow(ctx,
		"SELECT true, datistemplate FROM pg_database WHERE datname = $1", name).Scan(&exists, &ready)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", err
	}
	if !ready {
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(name)+" WITH (FORCE)"); err != nil {
			return "", err
		}
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident(name)); err != nil {
			return "", err
		}
		if err := tmpl.Migrate(ctx, withDatabase(admin, name)); err != nil {
			return "", fmt.Errorf("migrate %s: %w", name, err)
		}
		// Refuse further connections (cloning needs none open) and end any
		// the migration left behind, then mark it complete.
		if _, err := conn.Exec(ctx, "ALTER DATABASE "+ident(name)+" WITH ALLOW_CONNECTIONS false"); err != nil {
			return "", err
		}
		if _, err := conn.Exec(ctx,
			"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", name); err != nil {
			return "", err
		}
		if _, err := conn.Exec(ctx, "ALTER DATABASE "+ident(name)+" WITH IS_TEMPLATE true"); err != nil {
			return "", err
		}
	}
	templates[key] = true
	return name, nil
}

var nonIdent = regexp.MustCompile(`[^a-z0-9_]+`)

// templateName is tmpl_<name>_<version>, lower-cased, reduced to [a-z0-9_]
// and cut to PostgreSQL's 63-byte identifier limit.
func templateName(tmpl Template) string {
	clean := func(s string) string { return nonIdent.ReplaceAllString(strings.ToLower(s), "_") }
	n := "tmpl_" + clean(tmpl.Name)
	if tmpl.Version != "" {
		n += "_" + clean(tmpl.Version)
	}
	if len(n) > 63 {
		n = n[:63]
	}
	return n
}

// VersionOf hashes every file in fsys (names and contents) into a 12-hex
// version for Template.Version, so editing a migration makes a new template.
func VersionOf(fsys fs.FS) (string, error) {
	h := sha256.New()
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", p, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

func ident(s string) string { return pgx.Identifier{s}.Sanitize() }

// withUser returns the URL u logging in as user (with password, when not empty).
func withUser(u, user, password string) string {
	pu, err := url.Parse(u)
	if err != nil {
		panic(fmt.Sprintf("testenv: PostgreSQL URL %q is not a URL", u))
	}
	if password != "" {
		pu.User = url.UserPassword(user, password)
	} else {
		pu.User = url.User(user)
	}
	return pu.String()
}

// withDatabase returns the URL u naming database db instead.
func withDatabase(u, db string) string {
	pu, err := url.Parse(u)
	if err != nil || pu.Scheme == "" {
		// Keyword/value DSNs ("host=... dbname=...") are not supported.
		panic(fmt.Sprintf("testenv: PostgreSQL URL %q is not a postgres:// URL", u))
	}
	pu.Path = "/" + db
	return pu.String()
}
