package instances

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances/lifecycle"
	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// HealthCheck is how the agent decides an instance is healthy.
type HealthCheck struct {
	// Type is "http" (GET Path on the app's port answers 2xx/3xx) or "tcp" (the port
	// accepts a connection).
	Type string `json:"type"`
	Path string `json:"path,omitempty"`
	// Zero: the agent's defaults (proto/fabric/apptask).
	IntervalSeconds  int `json:"interval_seconds,omitempty"`
	TimeoutSeconds   int `json:"timeout_seconds,omitempty"`
	FailureThreshold int `json:"failure_threshold,omitempty"`
	// StartupTimeoutSeconds: never healthy this long after the start is failed; zero
	// is Config.HealthTimeout. The control plane's own timeout is the larger of the two.
	StartupTimeoutSeconds int `json:"startup_timeout_seconds,omitempty"`
}

// Version is what a launch needs of an app version of the catalog.
type Version struct {
	AppSlug string
	AppName string
	Kind    string // V3WorkloadKind
	Version string
	// Command is command[0] and its arguments, templates the agent expands ({port},
	// {gpu_ids}, {home}, {base_path}, ... proto/fabric/apptask); Env likewise.
	Command []string
	Env     map[string]string
	// Port is the port the app serves; 0 lets the control plane assign one.
	Port   int
	Health HealthCheck
	// MinGPUs and GPUModel ("" = any) bound the allocation an instance may run on.
	MinGPUs  int
	GPUModel string
	// WholeAllocation: the version needs the allocation to itself (no other live
	// instance on it, and none added beside it).
	WholeAllocation bool
	// BootstrapSSH: the node must trust the allocation's SSH keys for the app
	// (reconciled by an app.bootstrap_ssh node task).
	BootstrapSSH bool
}

// Catalog resolves an app version for a launch by a caller of tenantID: app_not_found,
// app_version_not_found (also for a deprecated version: it cannot be launched any
// more), app_not_entitled.
type Catalog interface {
	LaunchVersion(ctx context.Context, tenantID uuid.UUID, appSlug, version string) (Version, error)
}

// Allocations is what instances need of allocations (implemented by
// *allocations.Service): one of the project (another project's is
// allocation_not_found), and a launch with every allocation check (it joins the
// ambient transaction of ctx, db.WithTx).
type Allocations interface {
	Get(ctx context.Context, projectID, id uuid.UUID) (allocations.Allocation, error)
	Create(ctx context.Context, p *principal.Principal, proj projectctx.Project, spec allocations.CreateSpec) (allocations.Allocation, error)
	Release(ctx context.Context, p *principal.Principal, proj projectctx.Project, id uuid.UUID) (allocations.Allocation, error)
	// ReleaseAsSystem releases the allocation launched for an instance that failed: no
	// user asked, and it must not keep its GPUs and billing.
	ReleaseAsSystem(ctx context.Context, projectID, id uuid.UUID, reason string) (allocations.Allocation, error)
}

// Artifacts checks that a launch's artifacts are the project's (implemented by the
// artifacts service): validation_error, reason artifact_not_found, otherwise. Nil: a
// launch that names artifacts is refused the same way.
type Artifacts interface {
	CheckProjectArtifacts(ctx context.Context, projectID uuid.UUID, ids []uuid.UUID) error
	// Mounts is the app.start list of the artifacts (files, sizes, SHA-256s), in ids'
	// order.
	Mounts(ctx context.Context, projectID uuid.UUID, ids []uuid.UUID) ([]*fabricv1.AppArtifactMount, error)
}

// Dispatcher delivers a task to a node's agent (implemented by *fabric.Server).
type Dispatcher interface {
	Dispatch(ctx context.Context, nodeID uuid.UUID, task *fabricv1.TaskDispatch) (*fabricv1.TaskAck, error)
}

// Defaults of Config.
const (
	DefaultMaxPerProject     = 8
	DefaultHealthTimeout     = 5 * time.Minute
	DefaultReconcileInterval = 2 * time.Second
	DefaultPortBase          = 20000
	DefaultPortCount         = 10000
	DefaultTaskTimeout       = 10 * time.Minute
)

// Config tunes the feature (GANTRY_APP_INSTANCES_*).
type Config struct {
	// MaxPerProject caps a project's live (not stopped or failed) instances; the next
	// launch is app_instance_quota_exceeded.
	MaxPerProject int
	// HealthTimeout: an instance not healthy for this long since it (re)started, or
	// since it turned unhealthy, fails with a reason.
	HealthTimeout time.Duration
	// ReconcileInterval is how often the reconcile pass runs.
	ReconcileInterval time.Duration
	// PortBase and PortCount bound the ports assigned on a node to versions that name
	// none.
	PortBase, PortCount int
	// TaskTimeout: a task the agent has not acknowledged by then is given up.
	TaskTimeout time.Duration
}

func (c Config) withDefaults() Config {
	if c.MaxPerProject <= 0 {
		c.MaxPerProject = DefaultMaxPerProject
	}
	if c.HealthTimeout <= 0 {
		c.HealthTimeout = DefaultHealthTimeout
	}
	if c.ReconcileInterval == 0 {
		c.ReconcileInterval = DefaultReconcileInterval
	}
	if c.PortBase <= 0 || c.PortBase > 65535 {
		c.PortBase = DefaultPortBase
	}
	if c.PortCount <= 0 || c.PortBase+c.PortCount > 65536 {
		c.PortCount = min(DefaultPortCount, 65536-c.PortBase)
	}
	if c.TaskTimeout <= 0 {
		c.TaskTimeout = DefaultTaskTimeout
	}
	return c
}

// Service is app instances over PostgreSQL.
type Service struct {
	Pool        *pgxpool.Pool
	Clock       clock.Clock
	IDs         ids.Source
	Audit       *audit.Log
	Outbox      *outbox.Writer
	Catalog     Catalog
	Allocations Allocations
	Artifacts   Artifacts
	// Dispatcher may be nil (no node fabric): tasks wait in the database.
	Dispatcher Dispatcher
	Config     Config
	Log        *slog.Logger
}

// New returns the service with defaults for what cfg leaves zero.
func New(pool *pgxpool.Pool, clk clock.Clock, idSrc ids.Source, cfg Config, cat Catalog, allocs Allocations, disp Dispatcher, log *slog.Logger) *Service {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{
		Pool: pool, Clock: clk, IDs: idSrc,
		Audit:   &audit.Log{Clock: clk, IDs: idSrc},
		Outbox:  &outbox.Writer{Clock: clk, IDs: idSrc},
		Catalog: cat, Allocations: allocs, Dispatcher: disp,
		Config: cfg.withDefaults(), Log: log,
	}
}

func (s *Service) now() time.Time { return s.Clock.Now().UTC() }

// Instance is an app instance row.
type Instance struct {
	ID                uuid.UUID
	TenantID          uuid.UUID
	ProjectID         uuid.UUID
	OwnerUserID       uuid.UUID
	Name              string
	AppSlug           string
	AppVersion        string
	AppName           string
	ArtifactIDs       []uuid.UUID
	SharedRuntimeID   uuid.NullUUID
	AllocationID      uuid.UUID
	AllocationCreated bool
	NodeID            uuid.UUID
	Port              int
	State             lifecycle.State
	StateReason       *string
	RunSpec           json.RawMessage
	BootstrapSSH      bool
	RestartCount      int
	ReportGeneration  int64
	LastReportAt      *time.Time
	NotReadySince     *time.Time
	RunningAt         *time.Time
	CreatedAt         time.Time
	UpdatedAt         time.Time
	EndedAt           *time.Time
}

const instanceColumns = `id, tenant_id, project_id, owner_user_id, name, app_slug, app_version, app_name, artifact_ids,
	shared_runtime_id, allocation_id,
	allocation_created, node_id, port, state, state_reason, run_spec, bootstrap_ssh, restart_count,
	report_generation, last_report_at, not_ready_since, running_at, created_at, updated_at, ended_at`

func scanInstance(row pgx.Row) (Instance, error) {
	var i Instance
	var state string
	err := row.Scan(&i.ID, &i.TenantID, &i.ProjectID, &i.OwnerUserID, &i.Name, &i.AppSlug, &i.AppVersion, &i.AppName,
		&i.ArtifactIDs, &i.SharedRuntimeID, &i.AllocationID,
		&i.AllocationCreated, &i.NodeID, &i.Port, &state, &i.StateReason, &i.RunSpec, &i.BootstrapSSH, &i.RestartCount,
		&i.ReportGeneration, &i.LastReportAt, &i.NotReadySince, &i.RunningAt, &i.CreatedAt, &i.UpdatedAt, &i.EndedAt)
	i.State = lifecycle.State(state)
	return i, err
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (s *Service) q(ctx context.Context) querier { return db.Querier(ctx, s.Pool) }

func notFound() error { return apierr.NotFound(apierr.AppInstanceNotFound, "app instance") }

// Get loads an instance of the project; one of another project is not found.
func (s *Service) Get(ctx context.Context, projectID, id uuid.UUID) (Instance, error) {
	i, err := scanInstance(s.q(ctx).QueryRow(ctx, `SELECT `+instanceColumns+` FROM app_instances WHERE id = $1 AND project_id = $2`, id, projectID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Instance{}, notFound()
	}
	if err != nil {
		return Instance{}, fmt.Errorf("load app instance: %w", err)
	}
	return i, nil
}

// Page is one page of a list; More says whether items follow.
type Page struct {
	Items []Instance
	More  bool
}

// List is a page of the project's instances by id.
func (s *Service) List(ctx context.Context, projectID, afterID uuid.UUID, limit int) (Page, error) {
	rows, err := s.q(ctx).Query(ctx, `SELECT `+instanceColumns+` FROM app_instances
		WHERE project_id = $1 AND ($2::uuid IS NULL OR id > $2) ORDER BY id LIMIT $3`,
		projectID, uuid.NullUUID{UUID: afterID, Valid: afterID != uuid.Nil}, limit+1)
	if err != nil {
		return Page{}, fmt.Errorf("list app instances: %w", err)
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Instance, error) { return scanInstance(r) })
	if err != nil {
		return Page{}, fmt.Errorf("list app instances: %w", err)
	}
	if items == nil {
		items = []Instance{}
	}
	if len(items) > limit {
		return Page{Items: items[:limit], More: true}, nil
	}
	return Page{Items: items}, nil
}

// lock loads an instance FOR UPDATE inside tx.
func lock(ctx context.Context, tx pgx.Tx, id uuid.UUID) (Instance, error) {
	i, err := scanInstance(tx.QueryRow(ctx, `SELECT `+instanceColumns+` FROM app_instances WHERE id = $1 FOR UPDATE`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Instance{}, notFound()
	}
	if err != nil {
		return Instance{}, fmt.Errorf("lock app instance: %w", err)
	}
	return i, nil
}

func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n])
}

func dbTx(ctx context.Context) (pgx.Tx, bool) { return db.TxFrom(ctx) }

func inTx(ctx context.Context, pool *pgxpool.Pool, fn func(tx pgx.Tx) error) error {
	return db.InTx(ctx, pool, fn)
}
