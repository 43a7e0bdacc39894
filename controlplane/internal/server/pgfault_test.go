package server_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/pgcluster"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

// faultyPostgres is a PostgreSQL cluster of the test's own (never the machine's shared
// server), migrated, that the test may stop, restart, freeze and thaw.
type faultyPostgres struct {
	t       *testing.T
	dir     string
	port    int
	cluster *pgcluster.Cluster
}

func startFaultyPostgres(t *testing.T) *faultyPostgres {
	t.Helper()
	_, err := pgcluster.BinDir()
	ci.SkipUnlessAvailable(t, "PostgreSQL server binaries", err)
	// Not t.TempDir: its parent is private to this user, and the server runs as the
	// postgres OS user when the tests run as root.
	dir, err := os.MkdirTemp("", "gantry-fault-pg-")
	if err != nil {
		t.Fatal(err)
	}
	f := &faultyPostgres{t: t, dir: dir}
	t.Cleanup(func() {
		if f.cluster != nil {
			_ = f.cluster.Stop() // thaws a frozen one first
		}
		os.RemoveAll(dir)
	})
	f.Start()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := db.Migrate(ctx, f.cluster.URL()); err != nil {
		t.Fatalf("migrate own cluster: %v", err)
	}
	return f
}

// Start starts the cluster, on the port it had before when restarted.
func (f *faultyPostgres) Start() {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, f.dir, pgcluster.Options{Port: f.port})
	if err != nil {
		f.t.Fatalf("start own PostgreSQL: %v", err)
	}
	f.cluster, f.port = c, c.Port()
}

// Stop shuts the server down (fast shutdown: sessions are ended, open transactions
// roll back).
func (f *faultyPostgres) Stop() {
	f.t.Helper()
	if err := f.cluster.Stop(); err != nil {
		f.t.Fatalf("stop own PostgreSQL: %v", err)
	}
}

// Pool is a pool on the cluster configured as the app configures its own.
func (f *faultyPostgres) Pool(connectTimeout time.Duration) *pgxpool.Pool {
	f.t.Helper()
	cfg, err := pgxpool.ParseConfig(f.cluster.URL())
	if err != nil {
		f.t.Fatal(err)
	}
	db.ConfigurePool(cfg)
	db.SetConnectTimeout(cfg, connectTimeout)
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(pool.Close)
	return pool
}

// Freeze stops every process of the server (SIGSTOP): connections are accepted by the
// kernel and then nothing answers, the way a hung host behaves.
func (f *faultyPostgres) Freeze() {
	f.t.Helper()
	if err := f.cluster.Freeze(); err != nil {
		f.t.Fatal(err)
	}
}

// Thaw continues the frozen server. Safe to call when nothing is frozen.
func (f *faultyPostgres) Thaw() { f.cluster.Thaw() }
