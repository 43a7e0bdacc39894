package budgets

import (
	"context"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers is the budgets slice of the generated strict-server interface.
type Handlers struct {
	Svc *Service
}

// NewHandlers returns the handlers over svc.
func NewHandlers(svc *Service) *Handlers { return &Handlers{Svc: svc} }

// ListBillingBudgets implements GET /api/v1/billing/budgets.
func (h *Handlers) ListBillingBudgets(ctx context.Context, req api.ListBillingBudgetsRequestObject) (api.ListBillingBudgetsResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	f := Filter{ProjectID: req.Params.ProjectID}
	if req.Params.ScopeType != nil {
		scope := string(*req.Params.ScopeType)
		f.ScopeType = &scope
	}
	list, err := h.Svc.List(ctx, p, f)
	if err != nil {
		return nil, err
	}
	out := api.BillingBudgetPostureResponse{Items: make([]api.BillingBudgetPosture, 0, len(list))}
	for _, ps := range list {
		out.Items = append(out.Items, apiPosture(ps))
	}
	return api.ListBillingBudgets200JSONResponse{Body: out}, nil
}

// CreateBillingBudget implements POST /api/v1/billing/budgets.
func (h *Handlers) CreateBillingBudget(ctx context.Context, req api.CreateBillingBudgetRequestObject) (api.CreateBillingBudgetResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	b := req.Body
	name, err := resolveName(b.Name, b.DisplayName)
	if err != nil {
		return nil, err
	}
	if name == nil {
		return nil, apierr.Validation("name", "name (or display_name) is required").With("reason", "required")
	}
	in := NewBudget{
		ScopeType: string(b.ScopeType), ProjectID: b.ProjectID, Name: *name, Period: string(b.Period),
		Amount: Money{b.Amount.AmountMinor, b.Amount.Currency}, ThresholdPercent: b.ThresholdPercent,
		Active: b.Active, StartsAt: b.StartsAt, EndsAt: b.EndsAt,
	}
	if b.EnforcementMode != nil {
		mode := string(*b.EnforcementMode)
		in.EnforcementMode = &mode
	}
	ps, err := h.Svc.Create(ctx, p, in)
	if err != nil {
		return nil, err
	}
	return api.CreateBillingBudget201JSONResponse{Body: apiPosture(ps)}, nil
}

// UpdateBillingBudget implements PATCH /api/v1/billing/budgets/{budget_id}.
func (h *Handlers) UpdateBillingBudget(ctx context.Context, req api.UpdateBillingBudgetRequestObject) (api.UpdateBillingBudgetResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	b := req.Body
	name, err := resolveName(b.Name, b.DisplayName)
	if err != nil {
		return nil, err
	}
	patch := Patch{
		Name: name, ThresholdPercent: b.ThresholdPercent, Active: b.Active, StartsAt: b.StartsAt, EndsAt: b.EndsAt,
		ClearEndsAt: b.ClearEndsAt != nil && *b.ClearEndsAt,
	}
	if b.Period != nil {
		period := string(*b.Period)
		patch.Period = &period
	}
	if b.Amount != nil {
		patch.Amount = &Money{b.Amount.AmountMinor, b.Amount.Currency}
	}
	if b.EnforcementMode != nil {
		mode := string(*b.EnforcementMode)
		patch.EnforcementMode = &mode
	}
	ps, err := h.Svc.Update(ctx, p, req.BudgetID, patch)
	if err != nil {
		return nil, err
	}
	return api.UpdateBillingBudget200JSONResponse{Body: apiPosture(ps)}, nil
}

// DeleteBillingBudget implements DELETE /api/v1/billing/budgets/{budget_id}.
func (h *Handlers) DeleteBillingBudget(ctx context.Context, req api.DeleteBillingBudgetRequestObject) (api.DeleteBillingBudgetResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	if err := h.Svc.Delete(ctx, p, req.BudgetID); err != nil {
		return nil, err
	}
	return api.DeleteBillingBudget204Response{}, nil
}

// DecideBillingBudget implements POST /api/v1/billing/budgets/decision. It writes nothing.
func (h *Handlers) DecideBillingBudget(ctx context.Context, req api.DecideBillingBudgetRequestObject) (api.DecideBillingBudgetResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	b := req.Body
	d, err := h.Svc.Decide(ctx, p, b.ProjectID, Money{b.ProposedAmount.AmountMinor, b.ProposedAmount.Currency})
	if err != nil {
		return nil, err
	}
	out := api.BillingBudgetDecisionResponse{Decision: api.BillingBudgetDecision(d.Outcome), Items: make([]api.BillingBudgetDecisionItem, 0, len(d.Items))}
	for _, it := range d.Items {
		out.Items = append(out.Items, api.BillingBudgetDecisionItem{
			BudgetPolicyID: it.BudgetID, ScopeType: api.BillingBudgetScopeType(it.ScopeType), ProjectID: nullID(it.ProjectID),
			DisplayName: it.Name, EnforcementMode: api.BillingBudgetEnforcementMode(it.EnforcementMode),
			Decision: api.BillingBudgetDecision(it.Decision), Reason: api.BillingBudgetDecisionItemReason(it.Reason),
			PeriodStart: it.Period.Start, PeriodEnd: it.Period.End,
			Spent: apiMoney(it.Spent), ProposedAmount: apiMoney(it.Proposed), ProjectedSpend: apiMoney(it.Projected),
			Budget: apiMoney(it.Budget), ThresholdPercent: it.ThresholdPercent,
			PercentUsedBefore: it.PercentBefore, PercentUsedAfter: it.PercentAfter,
		})
	}
	return api.DecideBillingBudget200JSONResponse{Body: out}, nil
}

// AcknowledgeBillingBudgetEvent implements POST /api/v1/billing/budget-events/{event_id}/acknowledge.
func (h *Handlers) AcknowledgeBillingBudgetEvent(ctx context.Context, req api.AcknowledgeBillingBudgetEventRequestObject) (api.AcknowledgeBillingBudgetEventResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	e, err := h.Svc.Acknowledge(ctx, p, req.EventID)
	if err != nil {
		return nil, err
	}
	return api.AcknowledgeBillingBudgetEvent200JSONResponse{Body: apiEvent(e)}, nil
}

// ResolveBillingBudgetEvent implements POST /api/v1/billing/budget-events/{event_id}/resolve.
func (h *Handlers) ResolveBillingBudgetEvent(ctx context.Context, req api.ResolveBillingBudgetEventRequestObject) (api.ResolveBillingBudgetEventResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	e, err := h.Svc.Resolve(ctx, p, req.EventID)
	if err != nil {
		return nil, err
	}
	return api.ResolveBillingBudgetEvent200JSONResponse{Body: apiEvent(e)}, nil
}

func apiMoney(m Money) api.Money { return api.Money{AmountMinor: m.AmountMinor, Currency: m.Currency} }

func nullID(id uuid.NullUUID) *uuid.UUID {
	if !id.Valid {
		return nil
	}
	v := id.UUID
	return &v
}

// apiPosture renders a posture; name and display_name carry the same value
// (docs/contract.md, choice 2).
func apiPosture(ps Posture) api.BillingBudgetPosture {
	b := ps.Budget
	out := api.BillingBudgetPosture{
		ID: b.ID, OrgID: b.TenantID, DepartmentID: ps.DepartmentID, ProjectID: nullID(b.ProjectID),
		ScopeType: api.BillingBudgetScopeType(b.ScopeType), Name: b.Name, DisplayName: b.Name,
		Period: api.BillingBudgetPosturePeriod(b.Period), Amount: api.Money{AmountMinor: b.AmountMinor, Currency: b.Currency},
		ThresholdPercent: int(b.ThresholdPercent), EnforcementMode: api.BillingBudgetEnforcementMode(b.EnforcementMode),
		Active: b.Active, StartsAt: b.StartsAt.UTC(), EndsAt: utc(b.EndsAt), CreatedAt: b.CreatedAt.UTC(), UpdatedAt: b.UpdatedAt.UTC(),
	}
	if ps.LatestEvent != nil {
		e := apiEvent(*ps.LatestEvent)
		out.LatestEvent = &e
	}
	return out
}

func apiEvent(e Event) api.BillingBudgetEvent {
	return api.BillingBudgetEvent{
		ID: e.ID, ThresholdKey: e.ThresholdKey, PeriodStart: e.PeriodStart.UTC(), PeriodEnd: e.PeriodEnd.UTC(),
		Spent:       api.Money{AmountMinor: e.SpentMinor, Currency: e.Currency},
		Budget:      api.Money{AmountMinor: e.BudgetMinor, Currency: e.Currency},
		PercentUsed: e.PercentUsed, Status: api.BillingBudgetEventStatus(e.Status),
		FirstSeenAt: e.FirstSeenAt.UTC(), LastSeenAt: e.LastSeenAt.UTC(), SeenCount: int(e.SeenCount), CorrelationID: e.CorrelationID,
	}
}
