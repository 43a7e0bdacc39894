package jobs_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"go.uber.org/goleak"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/jobs"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.MainThen(m, func() error { return goleak.Find() }) }

type noteArgs struct {
	Note string `json:"note"`
}

func (noteArgs) Kind() string { return "jobs_test.note" }

// noteWorker records each note it works; it fails a note's first attempt when asked.
type noteWorker struct {
	river.WorkerDefaults[noteArgs]
	mu        sync.Mutex
	seen      map[string]int
	failFirst map[string]bool
	done      chan string
}

func (w *noteWorker) Work(_ context.Context, j *river.Job[noteArgs]) error {
	w.mu.Lock()
	w.seen[j.Args.Note]++
	fail := w.failFirst[j.Args.Note] && j.Attempt == 1
	w.mu.Unlock()
	if fail {
		return errors.New("first attempt fails on purpose")
	}
	w.done <- j.Args.Note
	return nil
}

// NextRetry retries at once, so the retry test needs no River backoff wait.
func (w *noteWorker) NextRetry(*river.Job[noteArgs]) time.Time { return time.Now() }

func newRunner(t *testing.T) (*jobs.Runner, *noteWorker, *pgxpool.Pool) {
	t.Helper()
	pool := testenv.NewDatabase(t, apitest.Template)
	r, err := jobs.New(pool, jobs.Config{FetchPollInterval: 50 * time.Millisecond, StopTimeout: 5 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := &noteWorker{seen: map[string]int{}, failFirst: map[string]bool{}, done: make(chan string, 16)}
	river.AddWorker(r.Workers(), w)
	return r, w, pool
}

func run(t *testing.T, r *jobs.Runner) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func wait(t *testing.T, w *noteWorker, want string) {
	t.Helper()
	select {
	case got := <-w.done:
		if got != want {
			t.Fatalf("worked %q, want %q", got, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("job %q never ran", want)
	}
}

// A job inserted in a transaction exists exactly when the transaction committed.
func TestJobInsertedInTxRunsOnlyIfCommitted(t *testing.T) {
	r, w, db := newRunner(t)
	ctx := context.Background()
	for _, c := range []struct {
		note   string
		commit bool
	}{{"rolled-back", false}, {"committed", true}} {
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.InsertTx(ctx, tx, noteArgs{Note: c.note}, nil); err != nil {
			t.Fatal(err)
		}
		if c.commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	run(t, r)
	wait(t, w, "committed")
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE args->>'note' = 'rolled-back'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rolled-back job rows: %d, %v", n, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seen["rolled-back"] != 0 || w.seen["committed"] != 1 {
		t.Fatalf("worked %v", w.seen)
	}
}

func TestFailedJobIsRetried(t *testing.T) {
	r, w, _ := newRunner(t)
	w.failFirst["flaky"] = true
	run(t, r)
	if _, err := r.Insert(context.Background(), noteArgs{Note: "flaky"}, nil); err != nil {
		t.Fatal(err)
	}
	wait(t, w, "flaky")
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seen["flaky"] != 2 {
		t.Fatalf("flaky worked %d times, want 2 (a failure, then the retry)", w.seen["flaky"])
	}
}

func TestPeriodicJobRuns(t *testing.T) {
	r, w, _ := newRunner(t)
	r.AddPeriodic(river.NewPeriodicJob(river.PeriodicInterval(time.Hour), func() (river.JobArgs, *river.InsertOpts) {
		return noteArgs{Note: "periodic"}, nil
	}, &river.PeriodicJobOpts{RunOnStart: true}))
	run(t, r)
	wait(t, w, "periodic")
}

type unknownArgs struct{}

func (unknownArgs) Kind() string { return "jobs_test.unknown" }

func TestUnregisteredKindRefused(t *testing.T) {
	r, _, _ := newRunner(t)
	if _, err := r.Insert(context.Background(), unknownArgs{}, nil); err == nil {
		t.Fatal("a job kind with no worker was inserted")
	}
}

func TestRunWithoutWorkers(t *testing.T) {
	pool := testenv.NewDatabase(t, apitest.Template)
	r, err := jobs.New(pool, jobs.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	cancel()
	if err := <-errc; !errors.Is(err, jobs.ErrNoWorkers) {
		t.Fatalf("Run without workers: %v, want ErrNoWorkers", err)
	}
}
