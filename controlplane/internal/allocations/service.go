package allocations

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/allocationsdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/budgets"
	"github.com/gantry-gpu/gantry/controlplane/internal/catalog"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
	"github.com/gantry-gpu/gantry/controlplane/internal/sshkeys"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// Allocation is an allocation row.
type Allocation = allocationsdb.Allocation

// Event is one persisted status transition.
type Event = allocationsdb.AllocationEvent

// Catalog is what a launch reads from the catalog: the active SKU with its regions'
// states (implemented by *catalog.Service). Its price comes with billing's runway
// decision.
type Catalog interface {
	LaunchSKU(ctx context.Context, sku string) (catalog.LaunchTerms, error)
	GetOSImage(ctx context.Context, id uuid.UUID) (catalog.OSImage, error)
}

// Fleet is the GPU inventory of every node with what live allocations hold, and the
// narrow read placement makes for every launch (implemented by *nodes.Service).
type Fleet interface {
	Fleet(ctx context.Context, after uuid.UUID, limit int) (nodes.FleetView, error)
	PlacementCandidates(ctx context.Context, model string, regions []string, gpuCount, maxNodes int) ([]nodes.PlacementNode, error)
}

// Keys resolves a caller's SSH keys (implemented by *sshkeys.Service).
type Keys interface {
	Resolve(ctx context.Context, userID uuid.UUID, keyIDs []uuid.UUID) ([]sshkeys.Key, error)
}

// Budgets decides whether budgets allow a launch (implemented by *budgets.Service).
type Budgets interface {
	DecideLaunch(ctx context.Context, tenantID, projectID uuid.UUID, proposed budgets.Money) (budgets.Decision, error)
}

// Billing decides whether the wallet affords a launch and meters usage while an
// allocation runs (implemented by *billing.Service).
type Billing interface {
	CanLaunch(ctx context.Context, tenantID, projectID uuid.UUID, usageUnit string, quantity int64, currency string) (billing.Decision, error)
	StartUsage(ctx context.Context, tx pgx.Tx, u billing.UsageStart) (billing.UsageRecord, error)
	StopUsage(ctx context.Context, tx pgx.Tx, source string, sourceID uuid.UUID, endedAt time.Time) (billing.RateResult, error)
	// Accrued is what each source's usage has cost so far (accrued_cost).
	Accrued(ctx context.Context, source string, sourceIDs []uuid.UUID, now time.Time) (map[uuid.UUID]billing.Money, error)
}

// Drains completes a node's drain once nothing holds it any more (implemented by
// *nodes.Service); nil skips it.
type Drains interface {
	SettleDrain(ctx context.Context, nodeID uuid.UUID) error
}

// Defaults of Config.
const (
	DefaultMaxPerProject       = 16
	DefaultProvisioningTimeout = 10 * time.Minute
)

// Config tunes the feature (GANTRY_ALLOCATIONS_*, GANTRY_PROVISIONING_*).
type Config struct {
	// MaxPerProject caps the live (not released, failed or completed) allocations of a
	// project; the next create is allocation_concurrency_limit.
	MaxPerProject int
	// ProvisioningTimeout bounds how long an allocation may wait for its node's agent
	// before it fails (used by the provisioning dispatcher).
	ProvisioningTimeout time.Duration
	// ReportTimeout bounds how long an agent that acknowledged a task may take to
	// report its result before the task fails (ExpireUnreported).
	ReportTimeout time.Duration
	// PlacementHintTTL is how long a replica reuses one read of the placement
	// candidates for single launches (hints.go); < 0 reads them for every launch.
	PlacementHintTTL time.Duration
	// IdleUtilizationPercent: an active allocation whose every GPU stays under it for
	// IdleAfter goes idle; a GPU at or over it makes an idle one active again.
	IdleUtilizationPercent int
	// IdleAfter is how long utilization must stay under the threshold.
	IdleAfter time.Duration
	// IdleSampleMaxAge: a GPU sample older than this is no evidence (node silent).
	IdleSampleMaxAge time.Duration
}

// Service is allocations over PostgreSQL.
type Service struct {
	Pool    *pgxpool.Pool
	Clock   clock.Clock
	IDs     ids.Source
	Audit   *audit.Log
	Outbox  *outbox.Writer
	Catalog Catalog
	Fleet   Fleet
	Keys    Keys
	Budgets Budgets
	Billing Billing
	Drains  Drains
	// Ended, when set, runs inside the transaction that moves an allocation to a final
	// status (released, failed, completed), after the move: features that hold something
	// on the allocation's node for it let go of it there (storage attachments are marked
	// detached). Its error rolls the move back.
	Ended func(ctx context.Context, tx pgx.Tx, allocationID uuid.UUID) error
	// Attachments, when set, takes a launch's storage_attachments; its Active runs inside
	// the transaction of every move to active (a launch's attachments start there).
	Attachments LaunchAttachments
	Config      Config
	Log         *slog.Logger

	hints placementHints
}

// New returns the service with production defaults for what cfg leaves zero.
func New(pool *pgxpool.Pool, clk clock.Clock, idSrc ids.Source, cfg Config, cat Catalog, fleet Fleet, keys Keys, bud Budgets, bill Billing, log *slog.Logger) *Service {
	if cfg.MaxPerProject <= 0 {
		cfg.MaxPerProject = DefaultMaxPerProject
	}
	if cfg.ProvisioningTimeout <= 0 {
		cfg.ProvisioningTimeout = DefaultProvisioningTimeout
	}
	if cfg.PlacementHintTTL == 0 {
		cfg.PlacementHintTTL = DefaultPlacementHintTTL
	}
	if cfg.ReportTimeout <= 0 {
		cfg.ReportTimeout = DefaultReportTimeout
	}
	if cfg.IdleUtilizationPercent <= 0 || cfg.IdleUtilizationPercent > 100 {
		cfg.IdleUtilizationPercent = DefaultIdleUtilizationPercent
	}
	if cfg.IdleAfter <= 0 {
		cfg.IdleAfter = DefaultIdleAfter
	}
	if cfg.IdleSampleMaxAge <= 0 {
		cfg.IdleSampleMaxAge = DefaultIdleSampleMaxAge
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{
		Pool: pool, Clock: clk, IDs: idSrc,
		Audit:   &audit.Log{Clock: clk, IDs: idSrc},
		Outbox:  &outbox.Writer{Clock: clk, IDs: idSrc},
		Catalog: cat, Fleet: fleet, Keys: keys, Budgets: bud, Billing: bill,
		Config: cfg, Log: log,
	}
}

func (s *Service) read(ctx context.Context) *allocationsdb.Queries {
	return allocationsdb.New(db.Querier(ctx, s.Pool))
}

func (s *Service) now() time.Time { return s.Clock.Now().UTC() }

func notFound() error {
	return apierr.NotFound(apierr.AllocationNotFound, "allocation")
}

// Get loads an allocation of the project; one of another project is not found.
func (s *Service) Get(ctx context.Context, projectID, id uuid.UUID) (Allocation, error) {
	a, err := s.read(ctx).GetAllocation(ctx, allocationsdb.GetAllocationParams{ID: id, ProjectID: projectID})
	if errors.Is(err, pgx.ErrNoRows) {
		return Allocation{}, notFound()
	}
	if err != nil {
		return Allocation{}, fmt.Errorf("load allocation: %w", err)
	}
	return a, nil
}

// Page is one page of a list; More says whether items follow.
type Page[T any] struct {
	Items []T
	More  bool
}

func page[T any](rows []T, limit int) Page[T] {
	if rows == nil {
		rows = []T{}
	}
	if len(rows) > limit {
		return Page[T]{Items: rows[:limit], More: true}
	}
	return Page[T]{Items: rows}
}

func after(id uuid.UUID) uuid.NullUUID { return uuid.NullUUID{UUID: id, Valid: id != uuid.Nil} }

// List is a page of the project's allocations by id.
func (s *Service) List(ctx context.Context, projectID, afterID uuid.UUID, limit int) (Page[Allocation], error) {
	rows, err := s.read(ctx).ListAllocations(ctx, allocationsdb.ListAllocationsParams{
		ProjectID: projectID, After: after(afterID), Limit: int32(limit + 1),
	})
	if err != nil {
		return Page[Allocation]{}, fmt.Errorf("list allocations: %w", err)
	}
	return page(rows, limit), nil
}

// Events is a page of the allocation's status events, oldest first.
func (s *Service) Events(ctx context.Context, projectID, id, afterID uuid.UUID, limit int) (Page[Event], error) {
	if _, err := s.Get(ctx, projectID, id); err != nil {
		return Page[Event]{}, err
	}
	rows, err := s.read(ctx).ListEvents(ctx, allocationsdb.ListEventsParams{
		AllocationID: id, After: after(afterID), Limit: int32(limit + 1),
	})
	if err != nil {
		return Page[Event]{}, fmt.Errorf("list allocation events: %w", err)
	}
	return page(rows, limit), nil
}
