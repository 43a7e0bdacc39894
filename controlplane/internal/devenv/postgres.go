package devenv

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/gantry-gpu/gantry/shared/pgcluster"
)

// DevDatabase is the database make dev uses on a server it did not get from DATABASE_URL.
const DevDatabase = "gantry_dev"

// FallbackClusterDir holds the throwaway cluster when the postgres OS user cannot reach
// <dir>/pg.
const FallbackClusterDir = "/tmp/gantry-dev-pg"

// resolvePostgres sets MigrateDatabaseURL, the owner's: GANTRY_MIGRATE_DATABASE_URL when
// set, else DATABASE_URL; else the local server (database gantry_dev); else a throwaway
// cluster. ownDB reports whether the database is make dev's own (not named by a URL).
func (e *Env) resolvePostgres(ctx context.Context, opts Options, note func(string, ...any)) (ownDB bool, err error) {
	if u := firstNonEmpty(opts.MigrateDatabaseURL, os.Getenv("GANTRY_MIGRATE_DATABASE_URL")); u != "" {
		if err := pgcluster.Ping(ctx, u); err != nil {
			return false, fmt.Errorf("GANTRY_MIGRATE_DATABASE_URL is set but does not answer: %w", err)
		}
		e.MigrateDatabaseURL, e.Postgres = u, "GANTRY_MIGRATE_DATABASE_URL"
		return false, nil
	}
	if u := firstNonEmpty(opts.DatabaseURL, os.Getenv("DATABASE_URL")); u != "" {
		if err := pgcluster.Ping(ctx, u); err != nil {
			return false, fmt.Errorf("DATABASE_URL is set but does not answer: %w", err)
		}
		e.MigrateDatabaseURL, e.Postgres = u, "DATABASE_URL"
		return false, nil
	}
	local := firstNonEmpty(opts.LocalPostgresURL, pgcluster.DefaultURL)
	if u, ok := pgcluster.Discover(ctx, local); ok {
		if e.MigrateDatabaseURL, err = ensureDatabase(ctx, u, DevDatabase); err != nil {
			return false, err
		}
		e.Postgres = fmt.Sprintf("local server %s, database %s", hostOf(u), DevDatabase)
		return true, nil
	}

	clusterDir := filepath.Join(e.Dir, "pg")
	if blocked, err := reachableByPostgres(e.Dir, clusterDir, note); err != nil {
		return false, err
	} else if blocked != "" {
		note("the postgres OS user cannot reach %s (%s); the throwaway cluster lives in %s instead (make the path searchable, e.g. chmod o+x %s, to keep it under %s)",
			clusterDir, blocked, FallbackClusterDir, blocked, e.rel(clusterDir))
		clusterDir = FallbackClusterDir
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(cctx, clusterDir, pgcluster.Options{})
	if err != nil {
		return false, fmt.Errorf("no PostgreSQL: DATABASE_URL is not set, nothing answers at %s, and a throwaway cluster could not start: %w", hostOf(local), err)
	}
	e.closers = append(e.closers, c.Stop)
	if e.MigrateDatabaseURL, err = ensureDatabase(ctx, c.URL(), DevDatabase); err != nil {
		return false, err
	}
	e.Postgres = fmt.Sprintf("throwaway cluster in %s (127.0.0.1:%d, database %s)", e.rel(c.Dir()), c.Port(), DevDatabase)
	return true, nil
}

// ensureDatabase creates database name on the server of adminURL when it is missing and
// returns the URL of that database.
func ensureDatabase(ctx context.Context, adminURL, name string) (string, error) {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return "", fmt.Errorf("connect %s: %w", hostOf(adminURL), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return "", fmt.Errorf("look up database %s: %w", name, err)
	}
	if !exists {
		_, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
		var pgErr *pgconn.PgError
		if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42P04") { // duplicate_database: created meanwhile
			return "", fmt.Errorf("create database %s: %w", name, err)
		}
	}
	u, err := url.Parse(adminURL)
	if err != nil {
		return "", err
	}
	u.Path = "/" + name
	return u.String(), nil
}

func hostOf(rawURL string) string {
	if u, err := url.Parse(rawURL); err == nil && u.Host != "" {
		return u.Host
	}
	return "the server"
}

// reachableByPostgres checks, when we are root (pgcluster then runs PostgreSQL as the
// postgres OS user), that the postgres user can search every directory above
// clusterDir. Directories of devDir (which make dev owns) are fixed by adding the search
// bit; blocked names the first directory outside it that stays unreachable ("" when
// all is well).
func reachableByPostgres(devDir, clusterDir string, note func(string, ...any)) (blocked string, err error) {
	if os.Geteuid() != 0 {
		return "", nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return "", nil // pgcluster.Start reports the missing user
	}
	uid, _ := strconv.Atoi(u.Uid)
	gids := map[int]bool{}
	if g, err := strconv.Atoi(u.Gid); err == nil {
		gids[g] = true
	}
	if more, err := u.GroupIds(); err == nil {
		for _, s := range more {
			if g, err := strconv.Atoi(s); err == nil {
				gids[g] = true
			}
		}
	}
	var chain []string
	for p := filepath.Dir(clusterDir); ; p = filepath.Dir(p) {
		chain = append(chain, p)
		if p == filepath.Dir(p) {
			break
		}
	}
	for i := len(chain) - 1; i >= 0; i-- { // from / down
		p := chain[i]
		fi, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok || searchable(fi.Mode(), int(st.Uid), int(st.Gid), uid, gids) {
			continue
		}
		if p == devDir || strings.HasPrefix(p, devDir+string(filepath.Separator)) {
			mode := fi.Mode().Perm() | 0o011
			if err := os.Chmod(p, mode); err != nil {
				return "", fmt.Errorf("make %s searchable for the postgres user: %w", p, err)
			}
			note("made %s searchable (mode %04o) so PostgreSQL, running as the postgres user, reaches its cluster", p, mode)
			continue
		}
		return p, nil
	}
	return "", nil
}

func searchable(mode os.FileMode, ownerUID, ownerGID, uid int, gids map[int]bool) bool {
	perm := mode.Perm()
	switch {
	case ownerUID == uid:
		return perm&0o100 != 0
	case gids[ownerGID]:
		return perm&0o010 != 0
	default:
		return perm&0o001 != 0
	}
}
