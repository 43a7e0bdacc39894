package budgets

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/budgets/budgetsdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
)

// Event statuses (seed §3, budget event).
const (
	StatusOpen         = "open"
	StatusAcknowledged = "acknowledged"
	StatusResolved     = "resolved"
)

// Transitions is the one table of allowed status moves: forward only. Asking for the
// status an event already has changes nothing and succeeds.
var Transitions = map[string][]string{
	StatusOpen:         {StatusAcknowledged, StatusResolved},
	StatusAcknowledged: {StatusResolved},
	StatusResolved:     {},
}

// CanMove reports whether an event may move from one status to another.
func CanMove(from, to string) bool { return slices.Contains(Transitions[from], to) }

// Acknowledge moves an event to acknowledged.
func (s *Service) Acknowledge(ctx context.Context, p *principal.Principal, eventID uuid.UUID) (Event, error) {
	return s.move(ctx, p, eventID, StatusAcknowledged)
}

// Resolve moves an event to resolved.
func (s *Service) Resolve(ctx context.Context, p *principal.Principal, eventID uuid.UUID) (Event, error) {
	return s.move(ctx, p, eventID, StatusResolved)
}

func (s *Service) move(ctx context.Context, p *principal.Principal, eventID uuid.UUID, to string) (Event, error) {
	tenant, err := tenantOf(p)
	if err != nil {
		return Event{}, err
	}
	var out Event
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := budgetsdb.New(tx)
		row, err := q.GetEventScope(ctx, budgetsdb.GetEventScopeParams{ID: eventID, TenantID: tenant})
		if errors.Is(err, pgx.ErrNoRows) {
			return notFound("budget event")
		}
		if err != nil {
			return fmt.Errorf("get budget event: %w", err)
		}
		if err := s.authorize(ctx, p, row.ScopeType, row.ProjectID, ActManage, "budget event"); err != nil {
			return err
		}
		out = row.BudgetEvent
		from := out.Status
		if from == to {
			return nil
		}
		if !CanMove(from, to) {
			return conflict("status_transition_not_allowed", "a %s budget event cannot become %s", from, to).
				With("status", from).With("requested_status", to)
		}
		now := s.Clock.Now()
		params := budgetsdb.SetEventStatusParams{ID: eventID, Status: to}
		by := uuid.NullUUID{UUID: p.UserID, Valid: true}
		if to == StatusAcknowledged {
			params.AcknowledgedAt, params.AcknowledgedBy = &now, by
		} else {
			params.ResolvedAt, params.ResolvedBy = &now, by
		}
		if out, err = q.SetEventStatus(ctx, params); err != nil {
			return fmt.Errorf("set budget event status: %w", err)
		}
		action := "budget.event.acknowledge"
		if to == StatusResolved {
			action = "budget.event.resolve"
		}
		return s.Audit.Record(ctx, tx, audit.Entry{
			Action: action, TargetType: "budget_event", TargetID: eventID.String(), TenantID: tenant, ProjectID: row.ProjectID.UUID,
			Metadata: map[string]any{"budget_id": out.BudgetID.String(), "from": from, "to": to},
		})
	})
	return out, err
}
