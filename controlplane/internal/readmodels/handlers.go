// Package readmodels serves the v3 read models a web shell reads (docs/operations.md;
// seed 2.4, 3; issue 21): the shell context with its attention counters, the workloads
// list with server-derived actionability and cost projection, attention dismissal and
// the notifications read marker.
package readmodels

import (
	"context"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// Tenancy is what the shell reads about the caller.
type Tenancy interface {
	Me(ctx context.Context, p *principal.Principal) (tenancy.Me, error)
	Access(ctx context.Context, p *principal.Principal, projectID uuid.UUID) (projectctx.Project, error)
}

// Regions lists the regions as the contract shows them (GET /api/v1/v3/regions).
type Regions interface {
	Regions(ctx context.Context) ([]api.V3Region, error)
}

// Balance is a tenant's balance in its default currency (billing.Service.Balance).
type Balance interface {
	Balance(ctx context.Context, tenantID uuid.UUID) (int64, string, error)
}

// Billing is what the cost projection reads from the billing engine.
type Billing interface {
	Accrued(ctx context.Context, source string, sourceIDs []uuid.UUID, now time.Time) (map[uuid.UUID]billing.Money, error)
	RunwayAt(ctx context.Context, tenantID uuid.UUID, currency string, now time.Time) (billing.Runway, error)
}

// Service computes the read models.
type Service struct {
	Pool    *pgxpool.Pool
	Clock   clock.Clock
	IDs     ids.Source
	Audit   *audit.Log
	Log     *slog.Logger
	Windows Windows
	Billing Billing
	Tenancy Tenancy
	Regions Regions
	Balance Balance
	// Cache keeps shell contexts: fresh for CacheTTL, kept (for stale answers) CacheKeep.
	Cache     Cache
	CacheTTL  time.Duration
	CacheKeep time.Duration
}

// Default cache times: the shell polls; 10 s keeps its counters close to exact while a
// burst of navigation costs one computation.
const (
	DefaultCacheTTL  = 10 * time.Second
	DefaultCacheKeep = 10 * time.Minute
)

// Deps are New's dependencies.
type Deps struct {
	Pool    *pgxpool.Pool
	Clock   clock.Clock
	IDs     ids.Source
	Log     *slog.Logger
	Windows Windows
	Billing Billing
	Tenancy Tenancy
	Regions Regions
	Balance Balance
	Cache   Cache // nil: a process-local cache
}

// New returns the service with defaults filled in.
func New(d Deps) *Service {
	s := &Service{Pool: d.Pool, Clock: d.Clock, IDs: d.IDs, Log: d.Log, Windows: d.Windows.withDefaults(),
		Billing: d.Billing, Tenancy: d.Tenancy, Regions: d.Regions, Balance: d.Balance, Cache: d.Cache,
		CacheTTL: DefaultCacheTTL, CacheKeep: DefaultCacheKeep, Audit: &audit.Log{Clock: d.Clock, IDs: d.IDs}}
	if s.Cache == nil {
		s.Cache = &MemoryCache{Now: d.Clock.Now}
	}
	return s
}

// Handlers implements the read-model operations of the contract.
type Handlers struct {
	Svc     *Service
	Cursors pagination.Codec
}

// NewHandlers returns the handlers over svc.
func NewHandlers(svc *Service, cursors pagination.Codec) *Handlers {
	return &Handlers{Svc: svc, Cursors: cursors}
}

func errModeNotAvailable(mode string) error {
	return apierr.New(apierr.InsufficientPermissions, "shell mode %q is not available to you", mode).With("field", "mode")
}

// RegionsFunc adapts a function to Regions.
type RegionsFunc func(ctx context.Context) ([]api.V3Region, error)

// Regions implements Regions.
func (f RegionsFunc) Regions(ctx context.Context) ([]api.V3Region, error) { return f(ctx) }
