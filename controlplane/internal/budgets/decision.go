package budgets

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/budgets/budgetsdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Decisions (seed BillingBudgetDecision), strongest last.
const (
	DecisionAllow      = "allow"
	DecisionWarn       = "warn"
	DecisionWouldBlock = "would_block"
)

// Reasons (seed BillingBudgetDecisionItem.reason).
const (
	ReasonWithinBudget     = "within_budget"
	ReasonThresholdCrossed = "threshold_crossed"
	ReasonBudgetExceeded   = "budget_exceeded"
)

var strength = map[string]int{DecisionAllow: 0, DecisionWarn: 1, DecisionWouldBlock: 2}

// Item is one budget's verdict on a proposed spend.
type Item struct {
	BudgetID         uuid.UUID
	ScopeType        string
	ProjectID        uuid.NullUUID
	Name             string
	EnforcementMode  string
	Decision         string
	Reason           string
	Period           Window
	Spent            Money
	Proposed         Money // the part of the proposal that counts: 0 in another currency
	Projected        Money
	Budget           Money
	ThresholdPercent int
	PercentBefore    int64
	PercentAfter     int64
}

// Decision is the verdict of every applicable budget. Outcome is the strongest item's
// decision (allow when there is none); Blocking is the first would_block item.
type Decision struct {
	Outcome  string
	Items    []Item
	Blocking *Item
}

// Blocked reports whether a launch must be refused.
func (d Decision) Blocked() bool { return d.Outcome == DecisionWouldBlock }

// Err is the refusal a launch path returns when Blocked (nil otherwise): 409
// invalid_request, details.reason budget_exceeded with the budget's id, name, scope and
// enforcement mode, so the client sees which budget stopped it.
func (d Decision) Err() error {
	if !d.Blocked() || d.Blocking == nil {
		return nil
	}
	b := d.Blocking
	e := apierr.New(apierr.InvalidRequest, "budget %q does not allow new launches this period", b.Name).
		WithStatus(409).With("reason", ReasonBudgetExceeded).With("budget_id", b.BudgetID.String()).
		With("budget_name", b.Name).With("scope_type", b.ScopeType).With("enforcement_mode", b.EnforcementMode).
		With("period_end", b.Period.End.Format(time.RFC3339))
	if b.ProjectID.Valid {
		e = e.With("project_id", b.ProjectID.UUID.String())
	}
	return e
}

// judge is one budget's verdict: with projected = spent + proposed, exhausted at >= 100
// %, warned at >= threshold_percent (Reached). Only block_launch and suspend budgets
// block; notify_only never does.
func judge(b Budget, spent, proposed int64) (decision, reason string) {
	projected := addSat(spent, proposed)
	switch {
	case Reached(projected, b.AmountMinor, exhaustedLevel):
		if b.EnforcementMode == ModeBlockLaunch || b.EnforcementMode == ModeSuspend {
			return DecisionWouldBlock, ReasonBudgetExceeded
		}
		return DecisionWarn, ReasonBudgetExceeded
	case Reached(projected, b.AmountMinor, int(b.ThresholdPercent)):
		return DecisionWarn, ReasonThresholdCrossed
	default:
		return DecisionAllow, ReasonWithinBudget
	}
}

func validateProposed(m Money) error {
	if !currencyPattern.MatchString(m.Currency) {
		return apierr.Validation("proposed_amount.currency", "currency must be three uppercase letters (ISO 4217)").With("reason", "pattern")
	}
	if m.AmountMinor < 0 || m.AmountMinor > maxProposedMinor {
		return apierr.Validation("proposed_amount.amount_minor", "proposed amount must be 0..%d minor units", int64(maxProposedMinor)).With("reason", "range")
	}
	return nil
}

// Decide is the dry-run decision of the API for the caller's tenant (and projectID's
// budgets when given). It writes nothing.
func (s *Service) Decide(ctx context.Context, p *principal.Principal, projectID *uuid.UUID, proposed Money) (Decision, error) {
	tenant, err := tenantOf(p)
	if err != nil {
		return Decision{}, err
	}
	if err := validateProposed(proposed); err != nil {
		return Decision{}, err
	}
	if projectID != nil {
		if err := s.require(ctx, p, ScopeProject, uuid.NullUUID{UUID: *projectID, Valid: true}, ActRead); err != nil {
			return Decision{}, err
		}
	}
	return s.decide(ctx, tenant, projectID, proposed)
}

// DecideLaunch is the allocation side's check before a launch in projectID of tenantID
// that is expected to cost proposed: Blocked() when a block_launch or suspend budget of
// the tenant or the project would reach 100 % (Err() is the refusal, naming the budget).
// It writes nothing.
func (s *Service) DecideLaunch(ctx context.Context, tenantID, projectID uuid.UUID, proposed Money) (Decision, error) {
	if err := validateProposed(proposed); err != nil {
		return Decision{}, err
	}
	return s.decide(ctx, tenantID, &projectID, proposed)
}

func (s *Service) decide(ctx context.Context, tenant uuid.UUID, projectID *uuid.UUID, proposed Money) (Decision, error) {
	params := budgetsdb.ApplicableBudgetsParams{TenantID: tenant}
	if projectID != nil {
		params.ProjectID = uuid.NullUUID{UUID: *projectID, Valid: true}
	}
	list, err := s.read(ctx).ApplicableBudgets(ctx, params)
	if err != nil {
		return Decision{}, fmt.Errorf("applicable budgets: %w", err)
	}
	now := s.Clock.Now()
	spend := spendCache{src: s.Spend}
	d := Decision{Outcome: DecisionAllow, Items: []Item{}}
	for _, b := range list {
		w, ok := PeriodAt(b.Period, b.StartsAt, b.EndsAt, now)
		if !ok {
			continue
		}
		spent, err := spend.get(ctx, b, w)
		if err != nil {
			return Decision{}, err
		}
		var prop int64
		if proposed.Currency == b.Currency { // never across currencies
			prop = proposed.AmountMinor
		}
		projected := addSat(spent, prop)
		decision, reason := judge(b, spent, prop)
		d.Items = append(d.Items, Item{
			BudgetID: b.ID, ScopeType: b.ScopeType, ProjectID: b.ProjectID, Name: b.Name, EnforcementMode: b.EnforcementMode,
			Decision: decision, Reason: reason, Period: w,
			Spent: Money{spent, b.Currency}, Proposed: Money{prop, b.Currency}, Projected: Money{projected, b.Currency},
			Budget: Money{b.AmountMinor, b.Currency}, ThresholdPercent: int(b.ThresholdPercent),
			PercentBefore: PercentUsed(spent, b.AmountMinor), PercentAfter: PercentUsed(projected, b.AmountMinor),
		})
		if strength[decision] > strength[d.Outcome] {
			d.Outcome = decision
		}
	}
	for i := range d.Items {
		if d.Items[i].Decision == DecisionWouldBlock {
			d.Blocking = &d.Items[i]
			break
		}
	}
	return d, nil
}

// spendCache asks the SpendSource once per (scope, currency, window).
type spendCache struct {
	src  SpendSource
	seen map[spendKey]int64
}

type spendKey struct {
	project  uuid.NullUUID
	currency string
	window   Window
}

func (c *spendCache) get(ctx context.Context, b Budget, w Window) (int64, error) {
	k := spendKey{b.ProjectID, b.Currency, w}
	if v, ok := c.seen[k]; ok {
		return v, nil
	}
	var project *uuid.UUID
	if b.ProjectID.Valid {
		project = &b.ProjectID.UUID
	}
	v, err := c.src.Spent(ctx, b.TenantID, project, b.Currency, w.Start, w.End)
	if err != nil {
		return 0, fmt.Errorf("spend of budget %s: %w", b.ID, err)
	}
	if c.seen == nil {
		c.seen = map[spendKey]int64{}
	}
	c.seen[k] = v
	return v, nil
}
