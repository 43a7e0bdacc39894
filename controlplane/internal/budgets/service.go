package budgets

import (
	"context"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/budgets/budgetsdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// SpendSource is where spend comes from (*billing.Service satisfies it).
type SpendSource interface {
	// rated spend (minor units, that currency only) of the tenant (optionally one project) with bill_from in [from, to)
	Spent(ctx context.Context, tenantID uuid.UUID, projectID *uuid.UUID, currency string, from, to time.Time) (int64, error)
}

// ProjectAccess resolves the caller's role in a project (*tenancy.Service satisfies it):
// the membership role, at least admin for a tenant admin; a project the caller cannot
// see is insufficient_permissions.
type ProjectAccess interface {
	Access(ctx context.Context, p *principal.Principal, projectID uuid.UUID) (projectctx.Project, error)
}

// Service is the budgets domain. Every mutation runs in db.InTx with its audit row and
// outbox event.
type Service struct {
	Pool     *pgxpool.Pool
	Clock    clock.Clock
	IDs      ids.Source
	Audit    *audit.Log
	Outbox   *outbox.Writer
	Spend    SpendSource
	Projects ProjectAccess
}

// New assembles the service; its audit log and outbox writer share clk and idSrc.
func New(pool *pgxpool.Pool, clk clock.Clock, idSrc ids.Source, spend SpendSource, projects ProjectAccess) *Service {
	return &Service{
		Pool: pool, Clock: clk, IDs: idSrc, Spend: spend, Projects: projects,
		Audit:  &audit.Log{Clock: clk, IDs: idSrc},
		Outbox: &outbox.Writer{Clock: clk, IDs: idSrc},
	}
}

func (s *Service) read(ctx context.Context) *budgetsdb.Queries {
	return budgetsdb.New(db.Querier(ctx, s.Pool))
}

// Event types (subjects gantry.events.<type>).
const (
	EventCreated          = "budget.created"
	EventUpdated          = "budget.updated"
	EventDeleted          = "budget.deleted"
	EventThresholdCrossed = "budget.threshold_crossed"
	// EventSuspendRequested asks the allocation side to stop the running workloads in
	// the budget's scope (payload: budget_id, tenant_id, project_id or null, scope_type,
	// event_id, period_start, period_end). Consumers are idempotent on event_id.
	EventSuspendRequested = "budget.suspend_requested"
)

func (s *Service) enqueue(ctx context.Context, tx pgx.Tx, typ string, payload map[string]any) error {
	_, err := s.Outbox.Enqueue(ctx, tx, outbox.Event{Type: typ, Subject: "gantry.events." + typ, Payload: payload})
	return err
}

// Scopes (seed BillingBudgetScopeType) and enforcement modes (BillingBudgetEnforcementMode).
const (
	ScopeTenant  = "tenant"
	ScopeProject = "project"

	ModeNotifyOnly  = "notify_only"
	ModeBlockLaunch = "block_launch"
	ModeSuspend     = "suspend"
)

// Modes lists the enforcement modes.
var Modes = []string{ModeNotifyOnly, ModeBlockLaunch, ModeSuspend}

// Action is something a caller does with a budget.
type Action string

// Budget actions.
const (
	ActRead   Action = "budget.read"   // see budgets, their posture and events; ask for a decision
	ActManage Action = "budget.manage" // create, update, delete; acknowledge and resolve events
)

// Roles that are not project roles: the caller's tenant role, for tenant-scoped budgets.
const (
	RoleTenantAdmin  = "tenant_admin"
	RoleTenantMember = "tenant_member"
)

// Permissions is the one table of who may do what: for a tenant-scoped budget the
// caller's tenant role, for a project-scoped one the caller's project role (a tenant
// admin counts as at least a project admin, tenancy.Access).
var Permissions = map[string]map[string][]Action{
	ScopeTenant: {
		RoleTenantAdmin:  {ActRead, ActManage},
		RoleTenantMember: {ActRead},
	},
	ScopeProject: {
		projectctx.RoleOwner:  {ActRead, ActManage},
		projectctx.RoleAdmin:  {ActRead, ActManage},
		projectctx.RoleMember: {ActRead},
		projectctx.RoleViewer: {ActRead},
	},
}

// Can reports whether role may perform a on a budget of scope.
func Can(scope, role string, a Action) bool { return slices.Contains(Permissions[scope][role], a) }

// tenantOf is the caller's tenant; callers outside a tenant have no budgets.
func tenantOf(p *principal.Principal) (uuid.UUID, error) {
	if p == nil || p.TenantID == uuid.Nil {
		return uuid.Nil, apierr.Forbidden("budgets belong to a tenant; you are not a member of one")
	}
	return p.TenantID, nil
}

// roleFor is the caller's role for a budget of scope (project scope: in projectID).
func (s *Service) roleFor(ctx context.Context, p *principal.Principal, scope string, projectID uuid.NullUUID) (string, error) {
	tenant, err := tenantOf(p)
	if err != nil {
		return "", err
	}
	if scope == ScopeTenant {
		if p.IsTenantAdmin(tenant) {
			return RoleTenantAdmin, nil
		}
		return RoleTenantMember, nil
	}
	pc, err := s.Projects.Access(ctx, p, projectID.UUID)
	if err != nil {
		return "", err
	}
	return pc.Role, nil
}

// require refuses a unless the caller's role allows it.
func (s *Service) require(ctx context.Context, p *principal.Principal, scope string, projectID uuid.NullUUID, a Action) error {
	role, err := s.roleFor(ctx, p, scope, projectID)
	if err != nil {
		return err
	}
	if !Can(scope, role, a) {
		return apierr.Forbidden("your role does not allow this").With("action", string(a)).With("role", role).With("scope_type", scope)
	}
	return nil
}

// notFound is the 404 of objects the contract has no *_not_found code for.
func notFound(what string) *apierr.Error {
	return apierr.New(apierr.InvalidRequest, "%s not found", what).With("reason", "not_found").WithStatus(404)
}

func conflict(reason, format string, args ...any) *apierr.Error {
	return apierr.New(apierr.InvalidRequest, format, args...).With("reason", reason).WithStatus(409)
}
