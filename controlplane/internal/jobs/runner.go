// Package jobs runs the control plane's background work as River jobs in PostgreSQL
// (ARCHITECTURE.md §4): a job is inserted in the same transaction as the change that
// causes it, so it exists exactly when that change committed, survives a crash of the
// replica that inserted it, and runs on whichever replica fetches it first.
//
// Features register their workers (river.AddWorker on Workers) and periodic jobs
// (AddPeriodic) while the app is assembled, insert jobs with InsertTx, and app.Run runs
// the Runner. River's tables are migrated by db.Migrate.
package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
)

// Config tunes the one River client of a control-plane replica.
type Config struct {
	// MaxWorkers is how many jobs this replica works at once (default 20).
	MaxWorkers int `env:"GANTRY_JOBS_MAX_WORKERS"`
	// FetchPollInterval is how often the client polls for jobs when no insert
	// notification arrived (default River's 1 s; tests shorten it).
	FetchPollInterval time.Duration
	// JobTimeout bounds one attempt of a job (default 1 min; a worker may set its own).
	JobTimeout time.Duration `env:"GANTRY_JOBS_JOB_TIMEOUT"`
	// StopTimeout is how long Run waits for jobs in flight when its context ends before
	// cancelling them (default 10 s); a cancelled job is retried by River later.
	StopTimeout time.Duration
	// RescueStuckJobsAfter is how long a job may stay running before River takes it for
	// lost (its replica was killed) and runs it again (default 5 min; River's own default
	// is an hour, which left a MAAS workflow step of a SIGKILLed replica waiting that long).
	// It must exceed every worker's Timeout (the longest today: a MAAS step attempt,
	// GANTRY_MAAS_STEP_ATTEMPT_TIMEOUT, 3 min): River leaves a running job alone until
	// both have passed, and a shorter value would not rescue sooner anyway. Shorter
	// means a killed replica's work resumes sooner; too short (below how long an attempt
	// can really take) runs a slow attempt twice at once, which the MAAS steps tolerate
	// (each is idempotent) but other workers may not (docs/jobs.md).
	RescueStuckJobsAfter time.Duration `env:"GANTRY_JOBS_RESCUE_STUCK_AFTER"`
}

func (c Config) withDefaults() Config {
	if c.MaxWorkers <= 0 {
		c.MaxWorkers = 20
	}
	if c.FetchPollInterval <= 0 {
		c.FetchPollInterval = time.Second
	}
	if c.JobTimeout <= 0 {
		c.JobTimeout = time.Minute
	}
	if c.StopTimeout <= 0 {
		c.StopTimeout = 10 * time.Second
	}
	if c.RescueStuckJobsAfter <= 0 {
		c.RescueStuckJobsAfter = max(5*time.Minute, 2*c.JobTimeout)
	}
	return c
}

// Runner owns the replica's River client.
type Runner struct {
	cfg     Config
	log     *slog.Logger
	workers *river.Workers
	client  *river.Client[pgx.Tx]

	mu      sync.Mutex
	started bool
}

// New builds the client over pool. Workers and periodic jobs are added afterwards
// (River captures them when Run starts the client).
func New(pool *pgxpool.Pool, cfg Config, log *slog.Logger) (*Runner, error) {
	cfg = cfg.withDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Runner{cfg: cfg, log: log, workers: river.NewWorkers()}
	var err error
	r.client, err = river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:               map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: cfg.MaxWorkers}},
		Workers:              r.workers,
		FetchPollInterval:    cfg.FetchPollInterval,
		FetchCooldown:        min(cfg.FetchPollInterval, 100*time.Millisecond),
		JobTimeout:           cfg.JobTimeout,
		RescueStuckJobsAfter: cfg.RescueStuckJobsAfter,
		Logger:               log.With("component", "jobs"),
	})
	if err != nil {
		return nil, fmt.Errorf("jobs: river client: %w", err)
	}
	return r, nil
}

// Workers is the bundle features add their workers to (river.AddWorker), before Run.
func (r *Runner) Workers() *river.Workers { return r.workers }

// Client is the River client, for what this package does not wrap (job lookups in tests,
// subscriptions).
func (r *Runner) Client() *river.Client[pgx.Tx] { return r.client }

// AddPeriodic schedules a periodic job; River's elected leader inserts it, so it runs
// once per period across all replicas.
func (r *Runner) AddPeriodic(job *river.PeriodicJob) { r.client.PeriodicJobs().Add(job) }

// InsertTx inserts a job in tx: it exists only if tx commits. A job kind with no
// registered worker is refused here rather than left unworked.
func (r *Runner) InsertTx(ctx context.Context, tx pgx.Tx, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error) {
	res, err := r.client.InsertTx(ctx, tx, args, opts)
	if err != nil {
		return nil, fmt.Errorf("jobs: insert %s: %w", args.Kind(), err)
	}
	return res, nil
}

// Insert inserts a job on its own (for work caused by no row change, e.g. an operator's
// request that is itself the record).
func (r *Runner) Insert(ctx context.Context, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error) {
	res, err := r.client.Insert(ctx, args, opts)
	if err != nil {
		return nil, fmt.Errorf("jobs: insert %s: %w", args.Kind(), err)
	}
	return res, nil
}

// ErrNoWorkers is returned by Run when nothing registered a worker: there is nothing to
// run, and River refuses to start an empty client.
var ErrNoWorkers = errors.New("jobs: no workers registered")

// Run starts the client and works jobs until ctx ends, then stops: jobs in flight get
// StopTimeout to finish, after which they are cancelled (and retried later by River).
func (r *Runner) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.started {
		r.mu.Unlock()
		return errors.New("jobs: Run called twice")
	}
	r.started = true
	r.mu.Unlock()
	// River's own context must outlive ctx: it is what the stop below drains.
	if err := r.client.Start(context.WithoutCancel(ctx)); err != nil {
		// River refuses to start a client whose bundle is empty; its bundle's contents
		// are private, so its refusal is how an empty one is recognised.
		if strings.Contains(err.Error(), "at least one Worker") {
			<-ctx.Done()
			return ErrNoWorkers
		}
		return fmt.Errorf("jobs: start: %w", err)
	}
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.StopTimeout)
	defer cancel()
	if err := r.client.Stop(stopCtx); err != nil {
		r.log.Warn("jobs: jobs still running at stop; cancelling them", "err", err)
		hard, cancelHard := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.StopTimeout)
		defer cancelHard()
		if err := r.client.StopAndCancel(hard); err != nil {
			return fmt.Errorf("jobs: stop: %w", err)
		}
	}
	return nil
}

// atLeast passes on only records at min or above.
type atLeast struct {
	h   slog.Handler
	min slog.Level
}

func (a atLeast) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= a.min && a.h.Enabled(ctx, l)
}
func (a atLeast) Handle(ctx context.Context, r slog.Record) error { return a.h.Handle(ctx, r) }
func (a atLeast) WithAttrs(attrs []slog.Attr) slog.Handler {
	return atLeast{h: a.h.WithAttrs(attrs), min: a.min}
}
func (a atLeast) WithGroup(name string) slog.Handler {
	return atLeast{h: a.h.WithGroup(name), min: a.min}
}
