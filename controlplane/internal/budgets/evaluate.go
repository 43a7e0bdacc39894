package budgets

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/budgets/budgetsdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/loop"
	"github.com/gantry-gpu/gantry/shared/correlation"
)

// Evaluation counts what one Evaluate did.
type Evaluation struct {
	Budgets          int // active budgets with a current period
	Opened           int // events opened (a new period, or a higher level)
	Seen             int // sightings of events already open this period
	SuspendRequested int // budget.suspend_requested events enqueued
}

// ThresholdKey is the dedupe key of the event for a level (a percentage of the amount).
func ThresholdKey(level int32) string { return fmt.Sprintf(thresholdKeyTemplate, level) }

// level is the highest level spent has reached: 100 when exhausted, else the budget's
// threshold_percent when reached (Reached, ">="), else 0.
func level(b Budget, spent int64) int32 {
	switch {
	case Reached(spent, b.AmountMinor, exhaustedLevel):
		return exhaustedLevel
	case Reached(spent, b.AmountMinor, int(b.ThresholdPercent)):
		return b.ThresholdPercent
	}
	return 0
}

// Evaluate measures every active budget of the tenant in its current period and records
// what it sees. For the highest level reached it opens the event (budget, period,
// threshold_key) or, when that event exists, counts one more sighting (seen_count,
// last_seen_at, latest spend); status never moves here. A new period or a higher level
// is a new key, hence a new event. A new event enqueues budget.threshold_crossed and an
// audit row; the first time a suspend budget is seen exhausted in a period, its 100 %
// event enqueues budget.suspend_requested (once per event, even if the mode is set to
// suspend later in the period). Billing calls it after rating; the loop calls it for
// every tenant with active budgets.
func (s *Service) Evaluate(ctx context.Context, tenantID uuid.UUID) (Evaluation, error) {
	var ev Evaluation
	list, err := s.read(ctx).ActiveBudgets(ctx, tenantID)
	if err != nil {
		return ev, fmt.Errorf("active budgets: %w", err)
	}
	if correlation.ID(ctx) == "" {
		ctx = correlation.WithID(ctx, correlation.NewID())
	}
	spend := spendCache{src: s.Spend}
	var errs []error
	for _, b := range list {
		now := s.Clock.Now()
		w, ok := PeriodAt(b.Period, b.StartsAt, b.EndsAt, now)
		if !ok {
			continue
		}
		ev.Budgets++
		spent, err := spend.get(ctx, b, w)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := s.observe(ctx, b.ID, tenantID, spent, now, &ev); err != nil {
			errs = append(errs, fmt.Errorf("evaluate budget %s: %w", b.ID, err))
		}
	}
	return ev, errors.Join(errs...)
}

// observe records one budget's spend in one transaction, against the budget as locked
// now (a concurrent update or delete wins cleanly).
func (s *Service) observe(ctx context.Context, id, tenant uuid.UUID, spent int64, now time.Time, ev *Evaluation) error {
	return db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := budgetsdb.New(tx)
		b, err := q.LockBudget(ctx, budgetsdb.LockBudgetParams{ID: id, TenantID: tenant})
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // deleted meanwhile
		}
		if err != nil {
			return fmt.Errorf("lock budget: %w", err)
		}
		w, ok := PeriodAt(b.Period, b.StartsAt, b.EndsAt, now)
		lvl := level(b, spent)
		if !b.Active || !ok || lvl == 0 {
			return nil
		}
		var corr *string
		if c := correlation.ID(ctx); c != "" {
			corr = &c
		}
		row, err := q.ObserveEvent(ctx, budgetsdb.ObserveEventParams{
			ID: s.IDs.New(), BudgetID: b.ID, TenantID: b.TenantID, ThresholdKey: ThresholdKey(lvl), LevelPercent: lvl,
			PeriodStart: w.Start, PeriodEnd: w.End, SpentMinor: spent, BudgetMinor: b.AmountMinor, Currency: b.Currency,
			PercentUsed: PercentUsed(spent, b.AmountMinor), FirstSeenAt: now, CorrelationID: corr,
		})
		if err != nil {
			return fmt.Errorf("observe budget event: %w", err)
		}
		e := row.BudgetEvent
		payload := eventPayload(b, e)
		if row.Inserted {
			ev.Opened++
			if err := s.Audit.Record(ctx, tx, audit.Entry{
				Action: "budget.threshold_crossed", TargetType: "budget_event", TargetID: e.ID.String(),
				TenantID: b.TenantID, ProjectID: b.ProjectID.UUID, ActorType: audit.ActorSystem,
				Metadata: map[string]any{
					"budget_id": b.ID.String(), "threshold_key": e.ThresholdKey, "percent_used": e.PercentUsed,
					"spent_minor": e.SpentMinor, "budget_minor": e.BudgetMinor, "currency": e.Currency,
				},
			}); err != nil {
				return err
			}
			if err := s.enqueue(ctx, tx, EventThresholdCrossed, payload); err != nil {
				return err
			}
		} else {
			ev.Seen++
		}
		if lvl != exhaustedLevel || b.EnforcementMode != ModeSuspend {
			return nil
		}
		n, err := q.MarkSuspendRequested(ctx, budgetsdb.MarkSuspendRequestedParams{ID: e.ID, SuspendRequestedAt: &now})
		if err != nil {
			return fmt.Errorf("mark suspend requested: %w", err)
		}
		if n == 0 {
			return nil // already asked for this event
		}
		ev.SuspendRequested++
		if err := s.Audit.Record(ctx, tx, audit.Entry{
			Action: "budget.suspend_requested", TargetType: "budget", TargetID: b.ID.String(),
			TenantID: b.TenantID, ProjectID: b.ProjectID.UUID, ActorType: audit.ActorSystem,
			Metadata: map[string]any{"event_id": e.ID.String(), "scope_type": b.ScopeType},
		}); err != nil {
			return err
		}
		return s.enqueue(ctx, tx, EventSuspendRequested, payload)
	})
}

func eventPayload(b Budget, e Event) map[string]any {
	p := budgetPayload(b)
	p["event_id"] = e.ID.String()
	p["threshold_key"] = e.ThresholdKey
	p["period_start"] = e.PeriodStart.UTC().Format(time.RFC3339Nano)
	p["period_end"] = e.PeriodEnd.UTC().Format(time.RFC3339Nano)
	p["percent_used"] = e.PercentUsed
	return p
}

// EvaluateAll evaluates every tenant that has an active budget. A tenant's failure does
// not stop the others.
func (s *Service) EvaluateAll(ctx context.Context) (Evaluation, error) {
	var total Evaluation
	tenants, err := s.read(ctx).TenantsWithActiveBudgets(ctx)
	if err != nil {
		return total, fmt.Errorf("tenants with budgets: %w", err)
	}
	var errs []error
	for _, t := range tenants {
		if ctx.Err() != nil {
			break
		}
		ev, err := s.Evaluate(ctx, t)
		total.Budgets += ev.Budgets
		total.Opened += ev.Opened
		total.Seen += ev.Seen
		total.SuspendRequested += ev.SuspendRequested
		if err != nil {
			errs = append(errs, err)
		}
	}
	return total, errors.Join(errs...)
}

// Run evaluates every interval until ctx ends (the control plane's background loop; see
// docs/decisions.md on loops vs River). Each pass is idempotent and safe on every
// replica: events dedupe on (budget, period, threshold_key), suspend requests on the
// event.
func (s *Service) Run(ctx context.Context, interval time.Duration, log *slog.Logger) {
	loop.Every(ctx, interval, log, "budget evaluation", func(ctx context.Context) error {
		_, err := s.EvaluateAll(ctx)
		return err
	})
}
