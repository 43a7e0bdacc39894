package server_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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
	frozen  []int
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
		f.Thaw()
		if f.cluster != nil {
			_ = f.cluster.Stop()
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

// Freeze stops the postmaster and every server process (SIGSTOP): connections are
// accepted by the kernel and then nothing answers, the way a hung host behaves. The
// backends lead process groups of their own, so each is signalled by pid; the
// postmaster first, so that it forks nothing meanwhile.
func (f *faultyPostgres) Freeze() {
	f.t.Helper()
	pm := f.postmasterPID()
	pids := append([]int{pm}, childrenOf(f.t, pm)...)
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			f.t.Fatalf("SIGSTOP %d: %v", pid, err)
		}
		f.frozen = append(f.frozen, pid)
	}
}

// Thaw continues every frozen process (children first). Safe to call when nothing is
// frozen.
func (f *faultyPostgres) Thaw() {
	for i := len(f.frozen) - 1; i >= 0; i-- {
		_ = syscall.Kill(f.frozen[i], syscall.SIGCONT)
	}
	f.frozen = nil
}

func (f *faultyPostgres) postmasterPID() int {
	f.t.Helper()
	b, err := os.ReadFile(filepath.Join(f.dir, "postmaster.pid"))
	if err != nil {
		f.t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if err != nil {
		f.t.Fatalf("postmaster.pid: %v", err)
	}
	return pid
}

// childrenOf lists the processes whose parent is pid, from /proc.
func childrenOf(t *testing.T, pid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child))
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after its ')'.
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out
}
