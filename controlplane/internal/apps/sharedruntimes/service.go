package sharedruntimes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps"
	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// Catalog answers whether a tenant may launch an app version (apps.Service).
type Catalog interface {
	LaunchVersion(ctx context.Context, tenant uuid.UUID, slug, version string) (apps.Launchable, error)
}

// Workers starts and stops the app instances that serve a runtime (the instances
// service, adapted in app). StartWorker joins the ambient transaction of ctx and
// returns the new instance and its node; StopWorker asks a live instance to stop (an
// instance already stopped or failed is not an error).
type Workers interface {
	StartWorker(ctx context.Context, p *principal.Principal, owner projectctx.Project, w WorkerSpec) (instanceID, nodeID uuid.UUID, err error)
	StopWorker(ctx context.Context, p *principal.Principal, owner projectctx.Project, instanceID uuid.UUID) error
}

// WorkerSpec is one worker to start.
type WorkerSpec struct {
	RuntimeID    uuid.UUID
	Name         string
	AppSlug      string
	Version      string
	AllocationID uuid.UUID
}

// Projects resolves a caller's role in a project (tenancy.Service).
type Projects interface {
	Access(ctx context.Context, p *principal.Principal, projectID uuid.UUID) (projectctx.Project, error)
}

// Usage is the billing engine's usage records (billing.Service).
type Usage interface {
	StartUsage(ctx context.Context, tx pgx.Tx, u billing.UsageStart) (billing.UsageRecord, error)
	StopUsage(ctx context.Context, tx pgx.Tx, source string, sourceID uuid.UUID, endedAt time.Time) (billing.RateResult, error)
	ListPlans(ctx context.Context) ([]billing.Plan, error)
	NewPlanVersion(ctx context.Context, planID uuid.UUID, effectiveFrom *time.Time, prices []billing.PriceInput) (billing.Plan, error)
}

// States.
const (
	OwnerPlatform = "platform"
	OwnerTenant   = "tenant"

	WorkerStarting  = "starting"
	WorkerRunning   = "running"
	WorkerUnhealthy = "unhealthy"
	WorkerDraining  = "draining"
	WorkerStopped   = "stopped"
	WorkerFailed    = "failed"

	OpPending   = "pending"
	OpRunning   = "running"
	OpSucceeded = "succeeded"
	OpFailed    = "failed"

	UnitRequest = "request"
)

// Runtime is a shared runtime with its workers.
type Runtime struct {
	ID             uuid.UUID
	Name           string
	AppSlug        string
	Version        string
	OwnerKind      string
	OwnerTenantID  uuid.UUID
	OwnerProjectID uuid.UUID
	UsageUnit      string
	UnitPriceMinor int64
	Currency       string
	Attached       bool // the project asked about is attached
	Workers        []Worker
	CreatedBy      uuid.UUID
	CreatedAt      time.Time
	UpdatedAt      time.Time
}

// BillingUnit is the priced unit of the runtime in the billing engine's price book: one
// call of an attached project.
func (r Runtime) BillingUnit() string { return BillingUnit(r.ID) }

// BillingUnit names runtime id's unit ("app_runtime.request.<id>").
func BillingUnit(id uuid.UUID) string { return "app_runtime.request." + id.String() }

// State is derived from the workers.
func (r Runtime) State() string {
	var running, starting, failed, stopped int
	for _, w := range r.Workers {
		switch w.State {
		case WorkerRunning:
			running++
		case WorkerStarting:
			starting++
		case WorkerFailed:
			failed++
		case WorkerStopped:
			stopped++
		}
	}
	n := len(r.Workers)
	switch {
	case n == 0 || starting == n:
		return "provisioning"
	case running == n:
		return "running"
	case stopped == n:
		return "stopped"
	case failed+stopped == n:
		return "failed"
	case running == 0 && starting > 0:
		return "provisioning"
	default:
		return "degraded"
	}
}

// Worker serves a runtime from one allocation through one app instance.
type Worker struct {
	ID            uuid.UUID
	RuntimeID     uuid.UUID
	AllocationID  uuid.UUID
	AppInstanceID uuid.NullUUID
	NodeID        uuid.NullUUID
	State         string
	StateReason   *string
	LastReportAt  *time.Time
	CreatedAt     time.Time
	UpdatedAt     time.Time
}

// Service is shared runtimes.
type Service struct {
	Pool     *pgxpool.Pool
	Clock    clock.Clock
	IDs      ids.Source
	Audit    *audit.Log
	Log      *slog.Logger
	Catalog  Catalog
	Workers  Workers
	Projects Projects
	Usage    Usage
}

// New assembles the service.
func New(pool *pgxpool.Pool, clk clock.Clock, idSrc ids.Source, cat Catalog, workers Workers, projects Projects, usage Usage, log *slog.Logger) *Service {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{Pool: pool, Clock: clk, IDs: idSrc, Audit: &audit.Log{Clock: clk, IDs: idSrc}, Log: log,
		Catalog: cat, Workers: workers, Projects: projects, Usage: usage}
}

func notFound() *apierr.Error { return apierr.NotFound(apierr.AppNotFound, "shared runtime") }

// NewRuntime is what an admin creates.
type NewRuntime struct {
	Name, AppSlug, Version, OwnerKind string
	OwnerProjectID                    uuid.UUID
	AllocationIDs                     []uuid.UUID
	UsageUnit                         string
	UnitPriceMinor                    int64
	Currency                          string
}

// Create stores the runtime, starts one worker on each allocation and prices its unit
// in the default pricing plan (a new plan version with every current price and this
// one), all in one transaction audited shared_runtime.create.
func (s *Service) Create(ctx context.Context, p *principal.Principal, in NewRuntime) (Runtime, error) {
	if in.UnitPriceMinor < 0 {
		return Runtime{}, apierr.Validation("unit_price", "unit_price must not be negative")
	}
	exp, ok := billing.Exponent(in.Currency)
	if !ok {
		return Runtime{}, apierr.Validation("unit_price.currency", "unknown currency %s", in.Currency)
	}
	seen := map[uuid.UUID]bool{}
	for _, id := range in.AllocationIDs {
		if seen[id] {
			return Runtime{}, apierr.Validation("allocation_ids", "allocation %s is named twice", id).With("reason", "duplicate_allocation")
		}
		seen[id] = true
	}
	var owner projectctx.Project
	err := s.Pool.QueryRow(ctx, `SELECT id, tenant_id FROM projects WHERE id = $1 AND deleted_at IS NULL`, in.OwnerProjectID).Scan(&owner.ID, &owner.TenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return Runtime{}, apierr.Validation("owner_project_id", "no such project").With("reason", "project_not_found")
	}
	if err != nil {
		return Runtime{}, fmt.Errorf("owner project: %w", err)
	}
	// The admin acts for the owner project.
	owner.Role = projectctx.RoleOwner
	if _, err := s.Catalog.LaunchVersion(ctx, owner.TenantID, in.AppSlug, in.Version); err != nil {
		return Runtime{}, err
	}
	plan, err := s.defaultPlan(ctx)
	if err != nil {
		return Runtime{}, err
	}
	now := s.Clock.Now()
	r := Runtime{ID: s.IDs.New(), Name: in.Name, AppSlug: in.AppSlug, Version: in.Version, OwnerKind: in.OwnerKind,
		OwnerTenantID: owner.TenantID, OwnerProjectID: owner.ID, UsageUnit: in.UsageUnit, UnitPriceMinor: in.UnitPriceMinor,
		Currency: in.Currency, CreatedBy: p.UserID, CreatedAt: now, UpdatedAt: now}
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		tctx := db.WithTx(ctx, tx)
		_, err := tx.Exec(ctx, `INSERT INTO shared_runtimes (id, name, app_slug, app_version, owner_kind, owner_tenant_id, owner_project_id,
				usage_unit, unit_price_minor, currency, created_by, created_at, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $12)`,
			r.ID, r.Name, r.AppSlug, r.Version, r.OwnerKind, r.OwnerTenantID, r.OwnerProjectID, r.UsageUnit, r.UnitPriceMinor, r.Currency, p.UserID, now)
		if err != nil {
			return fmt.Errorf("insert shared runtime: %w", err)
		}
		for i, alloc := range in.AllocationIDs {
			if err := s.startWorker(tctx, tx, p, owner, r, uuid.Nil, alloc, i); err != nil {
				return err
			}
		}
		prices := append(latestPrices(plan), billing.PriceInput{Unit: r.BillingUnit(), Currency: r.Currency, UnitPrice: decimal(r.UnitPriceMinor, exp)})
		if _, err := s.Usage.NewPlanVersion(tctx, plan.ID, nil, prices); err != nil {
			return err
		}
		return s.Audit.Record(ctx, tx, audit.Entry{Action: "shared_runtime.create", TargetType: "shared_runtime", TargetID: r.ID.String(),
			TenantID: r.OwnerTenantID, ProjectID: r.OwnerProjectID, Metadata: map[string]any{"app_slug": r.AppSlug, "version": r.Version,
				"owner_kind": r.OwnerKind, "workers": len(in.AllocationIDs), "unit_price_minor": r.UnitPriceMinor, "currency": r.Currency}})
	})
	if err != nil {
		return Runtime{}, err
	}
	return s.get(ctx, r.ID, uuid.Nil)
}

// startWorker starts an app instance on alloc and records it as worker (a new worker
// when workerID is uuid.Nil, else the worker's new instance).
func (s *Service) startWorker(ctx context.Context, tx pgx.Tx, p *principal.Principal, owner projectctx.Project, r Runtime, workerID, alloc uuid.UUID, n int) error {
	inst, node, err := s.Workers.StartWorker(ctx, p, owner, WorkerSpec{RuntimeID: r.ID, Name: truncate(fmt.Sprintf("%s worker %d", r.Name, n+1), 120),
		AppSlug: r.AppSlug, Version: r.Version, AllocationID: alloc})
	if err != nil {
		return err
	}
	now := s.Clock.Now()
	if workerID == uuid.Nil {
		_, err = tx.Exec(ctx, `INSERT INTO shared_runtime_workers (id, shared_runtime_id, allocation_id, app_instance_id, node_id, state, created_at, updated_at)
			VALUES ($1, $2, $3, $4, $5, 'starting', $6, $6)`, s.IDs.New(), r.ID, alloc, inst, nullable(node), now)
	} else {
		_, err = tx.Exec(ctx, `UPDATE shared_runtime_workers SET app_instance_id = $2, node_id = $3, state = 'starting', state_reason = NULL, updated_at = $4
			WHERE id = $1`, workerID, inst, nullable(node), now)
	}
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	return nil
}

func (s *Service) defaultPlan(ctx context.Context) (billing.Plan, error) {
	plans, err := s.Usage.ListPlans(ctx)
	if err != nil {
		return billing.Plan{}, err
	}
	for _, pl := range plans {
		if pl.IsDefault && len(pl.Versions) > 0 {
			return pl, nil
		}
	}
	return billing.Plan{}, apierr.Validation("unit_price", "no default pricing plan exists to price the runtime's unit").With("reason", "no_pricing_plan")
}

func latestPrices(pl billing.Plan) []billing.PriceInput {
	last := pl.Versions[len(pl.Versions)-1]
	return append([]billing.PriceInput(nil), last.Prices...)
}

// decimal is minor units as an exact decimal of major units ("0.05" for 5 cents).
func decimal(minor int64, exp int) string {
	if exp == 0 {
		return strconv.FormatInt(minor, 10)
	}
	s := strconv.FormatInt(minor, 10)
	for len(s) <= exp {
		s = "0" + s
	}
	return s[:len(s)-exp] + "." + s[len(s)-exp:]
}

func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) > n {
		return string(r[:n])
	}
	return s
}

func nullable(id uuid.UUID) uuid.NullUUID { return uuid.NullUUID{UUID: id, Valid: id != uuid.Nil} }

const runtimeColumns = `r.id, r.name, r.app_slug, r.app_version, r.owner_kind, r.owner_tenant_id, r.owner_project_id, r.usage_unit,
	r.unit_price_minor, r.currency, r.created_by, r.created_at, r.updated_at`

func scanRuntime(row pgx.Row, extra ...any) (Runtime, error) {
	var r Runtime
	dst := []any{&r.ID, &r.Name, &r.AppSlug, &r.Version, &r.OwnerKind, &r.OwnerTenantID, &r.OwnerProjectID, &r.UsageUnit,
		&r.UnitPriceMinor, &r.Currency, &r.CreatedBy, &r.CreatedAt, &r.UpdatedAt}
	err := row.Scan(append(dst, extra...)...)
	return r, err
}

// visibleSQL: a platform-owned runtime is visible to every project; a tenant-owned one
// to the projects of its tenant ($1 the project's tenant).
const visibleSQL = `(r.owner_kind = 'platform' OR r.owner_tenant_id = $1)`

// get loads a runtime with its workers; attached says whether project is attached.
func (s *Service) get(ctx context.Context, id, project uuid.UUID) (Runtime, error) {
	var attached bool
	r, err := scanRuntime(db.Querier(ctx, s.Pool).QueryRow(ctx, `SELECT `+runtimeColumns+`,
		EXISTS (SELECT 1 FROM shared_runtime_attachments a WHERE a.shared_runtime_id = r.id AND a.project_id = $2)
		FROM shared_runtimes r WHERE r.id = $1`, id, project), &attached)
	if errors.Is(err, pgx.ErrNoRows) {
		return Runtime{}, notFound()
	}
	if err != nil {
		return Runtime{}, fmt.Errorf("get shared runtime: %w", err)
	}
	r.Attached = attached
	list := []Runtime{r}
	if err := s.fillWorkers(ctx, list); err != nil {
		return Runtime{}, err
	}
	return list[0], nil
}

// Get loads a runtime the project may see (another is app_not_found).
func (s *Service) Get(ctx context.Context, proj projectctx.Project, id uuid.UUID) (Runtime, error) {
	r, err := s.get(ctx, id, proj.ID)
	if err != nil {
		return Runtime{}, err
	}
	if r.OwnerKind != OwnerPlatform && r.OwnerTenantID != proj.TenantID {
		return Runtime{}, notFound()
	}
	return r, nil
}

// List is a page of the runtimes the project may see, by id.
func (s *Service) List(ctx context.Context, proj projectctx.Project, after uuid.UUID, limit int) ([]Runtime, bool, error) {
	rows, err := db.Querier(ctx, s.Pool).Query(ctx, `SELECT `+runtimeColumns+`,
		EXISTS (SELECT 1 FROM shared_runtime_attachments a WHERE a.shared_runtime_id = r.id AND a.project_id = $2)
		FROM shared_runtimes r WHERE `+visibleSQL+` AND r.id > $3 ORDER BY r.id LIMIT $4`, proj.TenantID, proj.ID, after, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("list shared runtimes: %w", err)
	}
	var out []Runtime
	for rows.Next() {
		var attached bool
		r, err := scanRuntime(rows, &attached)
		if err != nil {
			rows.Close()
			return nil, false, err
		}
		r.Attached = attached
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, false, err
	}
	more := len(out) > limit
	if more {
		out = out[:limit]
	}
	return out, more, s.fillWorkers(ctx, out)
}

const workerColumns = `id, shared_runtime_id, allocation_id, app_instance_id, node_id, state, state_reason, last_report_at, created_at, updated_at`

func scanWorker(row pgx.Row) (Worker, error) {
	var w Worker
	err := row.Scan(&w.ID, &w.RuntimeID, &w.AllocationID, &w.AppInstanceID, &w.NodeID, &w.State, &w.StateReason, &w.LastReportAt, &w.CreatedAt, &w.UpdatedAt)
	return w, err
}

func (s *Service) fillWorkers(ctx context.Context, list []Runtime) error {
	if len(list) == 0 {
		return nil
	}
	at := map[uuid.UUID]int{}
	ids := make([]uuid.UUID, len(list))
	for i := range list {
		ids[i], at[list[i].ID] = list[i].ID, i
		list[i].Workers = []Worker{}
	}
	rows, err := db.Querier(ctx, s.Pool).Query(ctx, `SELECT `+workerColumns+` FROM shared_runtime_workers
		WHERE shared_runtime_id = ANY($1) ORDER BY shared_runtime_id, id`, ids)
	if err != nil {
		return fmt.Errorf("workers: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		w, err := scanWorker(rows)
		if err != nil {
			return err
		}
		list[at[w.RuntimeID]].Workers = append(list[at[w.RuntimeID]].Workers, w)
	}
	return rows.Err()
}
