package budgets

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/budgets/budgetsdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Limits.
const (
	MaxNameLength        = 120
	MaxAmountMinor       = 1_000_000_000_000_000 // 10^15 minor units
	MaxBudgetsPerTenant  = 1000                  // BillingBudgetPostureResponse.items maxItems
	DefaultThreshold     = 80
	MinThresholdPercent  = 1
	MaxThresholdPercent  = 100
	DefaultEnforcement   = ModeNotifyOnly
	exhaustedLevel       = 100
	maxProposedMinor     = MaxAmountMinor
	thresholdKeyTemplate = "percent_%d"
)

var currencyPattern = regexp.MustCompile(`^[A-Z]{3}$`)

// Budget is a stored budget.
type Budget = budgetsdb.Budget

// Event is a stored budget event.
type Event = budgetsdb.BudgetEvent

// Money is an amount in minor units of one currency.
type Money struct {
	AmountMinor int64
	Currency    string
}

// Posture is a budget as the API shows it.
type Posture struct {
	Budget       Budget
	DepartmentID uuid.UUID
	LatestEvent  *Event
}

// NewBudget is a budget to create. Nil pointers take the defaults: threshold 80,
// notify_only, active, starts_at at the start of the current period.
type NewBudget struct {
	ScopeType        string
	ProjectID        *uuid.UUID
	Name             string
	Period           string
	Amount           Money
	ThresholdPercent *int
	EnforcementMode  *string
	Active           *bool
	StartsAt         *time.Time
	EndsAt           *time.Time
}

// Patch changes a budget; nil fields keep their value. ClearEndsAt removes ends_at.
type Patch struct {
	Name             *string
	Period           *string
	Amount           *Money
	ThresholdPercent *int
	EnforcementMode  *string
	Active           *bool
	StartsAt         *time.Time
	EndsAt           *time.Time
	ClearEndsAt      bool
}

// validate checks a whole budget (after defaults or a patch): every refusal is
// validation_error naming the field.
func validate(b *Budget) error {
	switch n := utf8.RuneCountInString(b.Name); {
	case n < 1 || n > MaxNameLength:
		return apierr.Validation("name", "name must be 1..%d characters", MaxNameLength).With("reason", "length")
	case strings.TrimSpace(b.Name) == "":
		return apierr.Validation("name", "name must not be blank").With("reason", "blank")
	case !utf8.ValidString(b.Name):
		return apierr.Validation("name", "name is not valid UTF-8").With("reason", "invalid")
	}
	if !slices.Contains(Periods, b.Period) {
		return apierr.Validation("period", "period must be one of %s", strings.Join(Periods, ", "))
	}
	if !currencyPattern.MatchString(b.Currency) {
		return apierr.Validation("amount.currency", "currency must be three uppercase letters (ISO 4217)").With("reason", "pattern")
	}
	if b.AmountMinor < 1 || b.AmountMinor > MaxAmountMinor {
		return apierr.Validation("amount.amount_minor", "amount must be 1..%d minor units", int64(MaxAmountMinor)).With("reason", "range")
	}
	if b.ThresholdPercent < MinThresholdPercent || b.ThresholdPercent > MaxThresholdPercent {
		return apierr.Validation("threshold_percent", "threshold_percent must be %d..%d", MinThresholdPercent, MaxThresholdPercent).With("reason", "range")
	}
	if !slices.Contains(Modes, b.EnforcementMode) {
		return apierr.Validation("enforcement_mode", "enforcement_mode must be one of %s", strings.Join(Modes, ", "))
	}
	if b.Period == PeriodCustom && b.EndsAt == nil {
		return apierr.Validation("ends_at", "a custom period needs ends_at").With("reason", "required")
	}
	if b.EndsAt != nil && !b.EndsAt.After(b.StartsAt) {
		return apierr.Validation("ends_at", "ends_at must be after starts_at").With("reason", "not_after_starts_at")
	}
	return nil
}

// name resolves the one name of a request that may spell it name, display_name or both.
func resolveName(name, displayName *string) (*string, error) {
	switch {
	case name != nil && displayName != nil && *name != *displayName:
		return nil, apierr.Validation("display_name", "name and display_name are the same value; send one, or both equal").With("reason", "mismatch")
	case name != nil:
		return name, nil
	default:
		return displayName, nil
	}
}

// Create stores a new budget for the caller's tenant.
func (s *Service) Create(ctx context.Context, p *principal.Principal, in NewBudget) (Posture, error) {
	tenant, err := tenantOf(p)
	if err != nil {
		return Posture{}, err
	}
	now := s.Clock.Now()
	b := Budget{
		ID: s.IDs.New(), TenantID: tenant, ScopeType: in.ScopeType, Name: in.Name, Period: in.Period,
		AmountMinor: in.Amount.AmountMinor, Currency: in.Amount.Currency, ThresholdPercent: DefaultThreshold,
		EnforcementMode: DefaultEnforcement, Active: true, EndsAt: utc(in.EndsAt),
		CreatedBy: uuid.NullUUID{UUID: p.UserID, Valid: true}, CreatedAt: now, UpdatedAt: now,
	}
	switch in.ScopeType {
	case ScopeTenant:
		if in.ProjectID != nil {
			return Posture{}, apierr.Validation("project_id", "a tenant-scoped budget has no project_id").With("reason", "not_allowed")
		}
	case ScopeProject:
		if in.ProjectID == nil {
			return Posture{}, apierr.Validation("project_id", "a project-scoped budget needs project_id").With("reason", "required")
		}
		b.ProjectID = uuid.NullUUID{UUID: *in.ProjectID, Valid: true}
	default:
		return Posture{}, apierr.Validation("scope_type", "scope_type must be tenant or project")
	}
	if in.ThresholdPercent != nil {
		b.ThresholdPercent = clampInt32(*in.ThresholdPercent)
	}
	if in.EnforcementMode != nil {
		b.EnforcementMode = *in.EnforcementMode
	}
	if in.Active != nil {
		b.Active = *in.Active
	}
	switch {
	case in.StartsAt != nil:
		b.StartsAt = in.StartsAt.UTC()
	case in.Period == PeriodCustom:
		return Posture{}, apierr.Validation("starts_at", "a custom period needs starts_at").With("reason", "required")
	default:
		b.StartsAt = DefaultStart(in.Period, now)
	}
	if err := validate(&b); err != nil {
		return Posture{}, err
	}
	if err := s.require(ctx, p, b.ScopeType, b.ProjectID, ActManage); err != nil {
		return Posture{}, err
	}

	var out Posture
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := budgetsdb.New(tx)
		if err := q.LockTenantBudgets(ctx, tenant); err != nil {
			return fmt.Errorf("lock tenant budgets: %w", err)
		}
		n, err := q.CountTenantBudgets(ctx, tenant)
		if err != nil {
			return fmt.Errorf("count budgets: %w", err)
		}
		if n >= MaxBudgetsPerTenant {
			return conflict("budget_limit_reached", "a tenant has at most %d budgets", MaxBudgetsPerTenant).With("limit", MaxBudgetsPerTenant)
		}
		if _, err := q.InsertBudget(ctx, budgetsdb.InsertBudgetParams{
			ID: b.ID, TenantID: b.TenantID, ProjectID: b.ProjectID, ScopeType: b.ScopeType, Name: b.Name,
			Period: b.Period, AmountMinor: b.AmountMinor, Currency: b.Currency, ThresholdPercent: b.ThresholdPercent,
			EnforcementMode: b.EnforcementMode, Active: b.Active, StartsAt: b.StartsAt, EndsAt: b.EndsAt,
			CreatedBy: b.CreatedBy, CreatedAt: now,
		}); err != nil {
			return fmt.Errorf("insert budget: %w", err)
		}
		if out, err = s.posture(ctx, q, b.ID, tenant); err != nil {
			return err
		}
		if err := s.Audit.Record(ctx, tx, audit.Entry{
			Action: "budget.create", TargetType: "budget", TargetID: b.ID.String(), TenantID: tenant, ProjectID: b.ProjectID.UUID,
			Metadata: map[string]any{
				"scope_type": b.ScopeType, "period": b.Period, "amount_minor": b.AmountMinor, "currency": b.Currency,
				"threshold_percent": b.ThresholdPercent, "enforcement_mode": b.EnforcementMode,
			},
		}); err != nil {
			return err
		}
		return s.enqueue(ctx, tx, EventCreated, budgetPayload(b))
	})
	return out, err
}

// Update applies patch to a budget of the caller's tenant. A patch that changes nothing
// writes nothing.
func (s *Service) Update(ctx context.Context, p *principal.Principal, id uuid.UUID, patch Patch) (Posture, error) {
	tenant, err := tenantOf(p)
	if err != nil {
		return Posture{}, err
	}
	var out Posture
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := budgetsdb.New(tx)
		cur, err := q.LockBudget(ctx, budgetsdb.LockBudgetParams{ID: id, TenantID: tenant})
		if errors.Is(err, pgx.ErrNoRows) {
			return notFound("budget")
		}
		if err != nil {
			return fmt.Errorf("lock budget: %w", err)
		}
		if err := s.authorize(ctx, p, cur.ScopeType, cur.ProjectID, ActManage, "budget"); err != nil {
			return err
		}
		next, changed, err := apply(cur, patch)
		if err != nil {
			return err
		}
		if len(changed) > 0 {
			next.UpdatedAt = s.Clock.Now()
			if _, err := q.UpdateBudget(ctx, budgetsdb.UpdateBudgetParams{
				ID: next.ID, TenantID: tenant, Name: next.Name, Period: next.Period, AmountMinor: next.AmountMinor,
				Currency: next.Currency, ThresholdPercent: next.ThresholdPercent, EnforcementMode: next.EnforcementMode,
				Active: next.Active, StartsAt: next.StartsAt, EndsAt: next.EndsAt, UpdatedAt: next.UpdatedAt,
			}); err != nil {
				return fmt.Errorf("update budget: %w", err)
			}
			if err := s.Audit.Record(ctx, tx, audit.Entry{
				Action: "budget.update", TargetType: "budget", TargetID: id.String(), TenantID: tenant, ProjectID: cur.ProjectID.UUID,
				Metadata: map[string]any{"changed": changed},
			}); err != nil {
				return err
			}
			if err := s.enqueue(ctx, tx, EventUpdated, budgetPayload(next)); err != nil {
				return err
			}
		}
		out, err = s.posture(ctx, q, id, tenant)
		return err
	})
	return out, err
}

// apply merges patch into b and validates the result; changed names the fields that
// moved.
func apply(b Budget, patch Patch) (Budget, []string, error) {
	next := b
	var changed []string
	mark := func(field string, moved bool) {
		if moved {
			changed = append(changed, field)
		}
	}
	if patch.Name != nil {
		next.Name = *patch.Name
		mark("name", next.Name != b.Name)
	}
	if patch.Period != nil {
		next.Period = *patch.Period
		mark("period", next.Period != b.Period)
	}
	if patch.Amount != nil {
		next.AmountMinor, next.Currency = patch.Amount.AmountMinor, patch.Amount.Currency
		mark("amount", next.AmountMinor != b.AmountMinor || next.Currency != b.Currency)
	}
	if patch.ThresholdPercent != nil {
		next.ThresholdPercent = clampInt32(*patch.ThresholdPercent)
		mark("threshold_percent", next.ThresholdPercent != b.ThresholdPercent)
	}
	if patch.EnforcementMode != nil {
		next.EnforcementMode = *patch.EnforcementMode
		mark("enforcement_mode", next.EnforcementMode != b.EnforcementMode)
	}
	if patch.Active != nil {
		next.Active = *patch.Active
		mark("active", next.Active != b.Active)
	}
	if patch.StartsAt != nil {
		next.StartsAt = patch.StartsAt.UTC()
		mark("starts_at", !next.StartsAt.Equal(b.StartsAt))
	}
	switch {
	case patch.ClearEndsAt && patch.EndsAt != nil:
		return b, nil, apierr.Validation("clear_ends_at", "send ends_at or clear_ends_at, not both").With("reason", "conflicting_fields")
	case patch.ClearEndsAt:
		next.EndsAt = nil
		mark("ends_at", b.EndsAt != nil)
	case patch.EndsAt != nil:
		next.EndsAt = utc(patch.EndsAt)
		mark("ends_at", b.EndsAt == nil || !next.EndsAt.Equal(*b.EndsAt))
	}
	if err := validate(&next); err != nil {
		return b, nil, err
	}
	return next, changed, nil
}

// Delete removes a budget of the caller's tenant and its events.
func (s *Service) Delete(ctx context.Context, p *principal.Principal, id uuid.UUID) error {
	tenant, err := tenantOf(p)
	if err != nil {
		return err
	}
	return db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := budgetsdb.New(tx)
		cur, err := q.LockBudget(ctx, budgetsdb.LockBudgetParams{ID: id, TenantID: tenant})
		if errors.Is(err, pgx.ErrNoRows) {
			return notFound("budget")
		}
		if err != nil {
			return fmt.Errorf("lock budget: %w", err)
		}
		if err := s.authorize(ctx, p, cur.ScopeType, cur.ProjectID, ActManage, "budget"); err != nil {
			return err
		}
		if _, err := q.DeleteBudget(ctx, budgetsdb.DeleteBudgetParams{ID: id, TenantID: tenant}); err != nil {
			return fmt.Errorf("delete budget: %w", err)
		}
		if err := s.Audit.Record(ctx, tx, audit.Entry{
			Action: "budget.delete", TargetType: "budget", TargetID: id.String(), TenantID: tenant, ProjectID: cur.ProjectID.UUID,
			Metadata: map[string]any{"name": cur.Name, "scope_type": cur.ScopeType},
		}); err != nil {
			return err
		}
		return s.enqueue(ctx, tx, EventDeleted, budgetPayload(cur))
	})
}

// Filter narrows List.
type Filter struct {
	ProjectID *uuid.UUID
	ScopeType *string
}

// List is the posture of every budget of the caller's tenant the caller may read.
func (s *Service) List(ctx context.Context, p *principal.Principal, f Filter) ([]Posture, error) {
	tenant, err := tenantOf(p)
	if err != nil {
		return nil, err
	}
	params := budgetsdb.ListBudgetsParams{TenantID: tenant, Limit: MaxBudgetsPerTenant, ScopeType: f.ScopeType}
	if f.ProjectID != nil {
		// Asking about a project one cannot see is refused, like every project access.
		if _, err := s.Projects.Access(ctx, p, *f.ProjectID); err != nil {
			return nil, err
		}
		params.ProjectID = uuid.NullUUID{UUID: *f.ProjectID, Valid: true}
	}
	q := s.read(ctx)
	rows, err := q.ListBudgets(ctx, params)
	if err != nil {
		return nil, fmt.Errorf("list budgets: %w", err)
	}
	out := make([]Posture, 0, len(rows))
	ids := make([]uuid.UUID, 0, len(rows))
	visible := map[uuid.NullUUID]bool{} // one access check per project
	for _, r := range rows {
		ok, seen := visible[r.Budget.ProjectID]
		if !seen {
			ok = s.authorize(ctx, p, r.Budget.ScopeType, r.Budget.ProjectID, ActRead, "budget") == nil
			visible[r.Budget.ProjectID] = ok
		}
		if ok {
			out = append(out, Posture{Budget: r.Budget, DepartmentID: r.DepartmentID})
			ids = append(ids, r.Budget.ID)
		}
	}
	if len(ids) == 0 {
		return out, nil
	}
	events, err := q.LatestEvents(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("latest budget events: %w", err)
	}
	latest := make(map[uuid.UUID]*Event, len(events))
	for i := range events {
		latest[events[i].BudgetID] = &events[i]
	}
	for i := range out {
		out[i].LatestEvent = latest[out[i].Budget.ID]
	}
	return out, nil
}

// posture loads one budget's posture with q.
func (s *Service) posture(ctx context.Context, q *budgetsdb.Queries, id, tenant uuid.UUID) (Posture, error) {
	row, err := q.GetBudget(ctx, budgetsdb.GetBudgetParams{ID: id, TenantID: tenant})
	if err != nil {
		return Posture{}, fmt.Errorf("get budget: %w", err)
	}
	out := Posture{Budget: row.Budget, DepartmentID: row.DepartmentID}
	events, err := q.LatestEvents(ctx, []uuid.UUID{id})
	if err != nil {
		return Posture{}, fmt.Errorf("latest budget event: %w", err)
	}
	if len(events) == 1 {
		out.LatestEvent = &events[0]
	}
	return out, nil
}

// authorize allows a on an object (a budget or an event) of a budget with this scope. A
// caller who may not even read it gets 404, so its existence is not revealed; one who
// may read but not a gets insufficient_permissions.
func (s *Service) authorize(ctx context.Context, p *principal.Principal, scope string, projectID uuid.NullUUID, a Action, what string) error {
	role, err := s.roleFor(ctx, p, scope, projectID)
	if apierr.CodeOf(err) == apierr.InsufficientPermissions {
		return notFound(what)
	}
	if err != nil {
		return err
	}
	if !Can(scope, role, ActRead) {
		return notFound(what)
	}
	if !Can(scope, role, a) {
		return apierr.Forbidden("your role does not allow this").With("action", string(a)).With("role", role).With("scope_type", scope)
	}
	return nil
}

func budgetPayload(b Budget) map[string]any {
	var project any
	if b.ProjectID.Valid {
		project = b.ProjectID.UUID.String()
	}
	return map[string]any{
		"budget_id": b.ID.String(), "tenant_id": b.TenantID.String(), "project_id": project, "scope_type": b.ScopeType,
		"enforcement_mode": b.EnforcementMode, "active": b.Active,
	}
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// clampInt32 keeps an out-of-range int out-of-range for validate without wrapping.
func clampInt32(v int) int32 {
	switch {
	case v > 1<<31-1:
		return 1<<31 - 1
	case v < -1<<31:
		return -1 << 31
	}
	return int32(v)
}
