package maas_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/app"
)

// The replica a test runs as a child process: this test binary re-executed with
// replicaEnv set, assembling the control plane from the environment exactly as
// `gantry-controlplane serve` does (app.LoadConfig, app.New, App.Run) and serving until
// it is signalled or killed.
const (
	replicaEnv = "GANTRY_MAAS_TEST_REPLICA"
	// parkLogEnv names a file: when set, the replica parks the first run of every step
	// whose workflow's node is named park-<workflow>-<step> inside the step's closing
	// transaction (MAAS called, writes made, nothing committed) and appends
	// "<workflow> <id> <step>" to the file. A step already in the file is not parked
	// again, so a restarted replica runs it to the end.
	parkLogEnv = "GANTRY_MAAS_TEST_PARK_LOG"
)

func runReplica() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := app.LoadConfig(true) // dev: the development master key, as apitest's
	if err != nil {
		fmt.Fprintln(os.Stderr, "replica:", err)
		return 1
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.Level()}))
	a, err := app.New(ctx, cfg, log, app.Options{NodeProbeDialer: okDialer{}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "replica:", err)
		return 1
	}
	defer a.Close()
	if path := os.Getenv(parkLogEnv); path != "" {
		p := &parker{path: path, pool: a.Pool}
		a.Maas.BeforeCommit = p.park
	}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "replica:", err)
		return 1
	}
	if err := a.Run(ctx, ln); err != nil {
		fmt.Fprintln(os.Stderr, "replica:", err)
		return 1
	}
	return 0
}

type parker struct {
	path string
	pool *pgxpool.Pool
	mu   sync.Mutex
}

func parkName(workflow, step string) string {
	return "park-" + workflow + "-" + strings.ReplaceAll(step, "_", "-")
}

// parked reads the park log: the (id, step) pairs parked by any replica so far.
func parked(path string) (map[string]bool, error) {
	out := map[string]bool{}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) == 3 {
			out[fields[1]+" "+fields[2]] = true
		}
	}
	return out, sc.Err()
}

func (p *parker) park(ctx context.Context, workflow string, id uuid.UUID, step string) error {
	var name string
	var err error
	if workflow == "onboarding" {
		err = p.pool.QueryRow(ctx, `SELECT COALESCE(hostname, '') FROM maas_onboardings WHERE id = $1`, id).Scan(&name)
	} else {
		err = p.pool.QueryRow(ctx, `SELECT node_name FROM maas_decommissions WHERE id = $1`, id).Scan(&name)
	}
	if err != nil || name != parkName(workflow, step) {
		return err
	}
	p.mu.Lock()
	done, err := parked(p.path)
	if err != nil || done[id.String()+" "+step] {
		p.mu.Unlock()
		return err
	}
	f, err := os.OpenFile(p.path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err == nil {
		_, err = fmt.Fprintf(f, "%s %s %s\n", workflow, id, step)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	p.mu.Unlock()
	if err != nil {
		return err
	}
	// Parked for good: neither River's attempt timeout nor a stop ends it; the test
	// kills the process here.
	select {}
}
