package readmodels

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cockroachdb/apd/v3"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/budgets"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
)

// Projection states.
const (
	CostAccruing = "accruing" // the billing engine has an open run for the workload
	CostPending  = "pending"  // priced, not billed yet (never active)
	CostStopped  = "stopped"  // priced, billing stopped
	CostUnpriced = "unpriced" // no rate is known
)

// Runway sources.
const (
	RunwayBalance = "balance"
	RunwayNone    = "none"
)

// Projection is a workload's cost projection (contract V3WorkloadCostProjection): every
// figure comes from the billing engine (the launch quote, billing.Accrued, and
// billing.RunwayAt, the runway launch checks use); this package only adds the time to
// the end of the budget period at the quoted rate.
type Projection struct {
	State         string
	Currency      string // "" when unpriced
	HourlyRate    *billing.Money
	Accrued       *billing.Money
	PeriodStart   *time.Time
	PeriodEnd     *time.Time
	Projected     *billing.Money
	RunwaySeconds *int64
	RunwayEndsAt  *time.Time
	RunwaySource  string
	ComputedAt    time.Time
}

type walletKey struct {
	tenant   uuid.UUID
	currency string
}

// Projections computes the projection of each workload at now: one accrued read for the
// page, one runway and one budget-period read per wallet on the page.
func (s *Service) Projections(ctx context.Context, ws []Workload, now time.Time) (map[uuid.UUID]Projection, error) {
	out := make(map[uuid.UUID]Projection, len(ws))
	if len(ws) == 0 {
		return out, nil
	}
	var billed []uuid.UUID
	wallets := map[walletKey]bool{}
	type periodKey struct {
		walletKey
		project uuid.UUID
	}
	periodKeys := map[periodKey]bool{}
	for _, w := range ws {
		if w.ActiveAt != nil {
			billed = append(billed, w.AllocationID)
		}
		if w.Currency != nil && w.HourlyRate != nil {
			k := walletKey{w.TenantID, *w.Currency}
			wallets[k] = true
			periodKeys[periodKey{k, w.ProjectID}] = true
		}
	}
	type wallet struct {
		open   map[uuid.UUID]bool
		runway time.Duration // -1: nothing burns
	}
	// The reads are independent: run them at once, so a page costs the slowest read
	// rather than their sum (each on its own pool connection; read-model handlers never
	// run inside a transaction, which could not be shared between goroutines).
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		errs    []error
		accrued map[uuid.UUID]billing.Money
		ws2     = map[walletKey]*wallet{}
		periods = map[periodKey]budgets.Window{}
	)
	do := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	do(func() error {
		m, err := s.Billing.Accrued(ctx, billing.SourceAllocation, billed, now)
		if err != nil {
			return fmt.Errorf("accrued: %w", err)
		}
		mu.Lock()
		accrued = m
		mu.Unlock()
		return nil
	})
	for k := range wallets {
		do(func() error {
			rw, err := s.Billing.RunwayAt(ctx, k.tenant, k.currency, now)
			if err != nil {
				return fmt.Errorf("runway: %w", err)
			}
			wl := &wallet{open: map[uuid.UUID]bool{}, runway: rw.Duration(apd.New(0, 0))}
			for _, r := range rw.Runs {
				if r.Source == billing.SourceAllocation {
					wl.open[r.SourceID] = true
				}
			}
			mu.Lock()
			ws2[k] = wl
			mu.Unlock()
			return nil
		})
	}
	for k := range periodKeys {
		do(func() error {
			win, err := s.budgetPeriod(ctx, k.tenant, k.project, k.currency, now)
			if err != nil {
				return err
			}
			mu.Lock()
			periods[k] = win
			mu.Unlock()
			return nil
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, w := range ws {
		p := Projection{State: CostUnpriced, RunwaySource: RunwayNone, ComputedAt: now.UTC()}
		if a, ok := accrued[w.AllocationID]; ok {
			a := a
			p.Accrued = &a
		}
		if w.Currency == nil || w.HourlyRate == nil {
			out[w.AllocationID] = p
			continue
		}
		p.Currency = *w.Currency
		p.HourlyRate = &billing.Money{AmountMinor: *w.HourlyRate, Currency: *w.Currency}
		k := walletKey{w.TenantID, *w.Currency}
		wl, win := ws2[k], periods[periodKey{k, w.ProjectID}]
		start, end := win.Start, win.End
		p.PeriodStart, p.PeriodEnd = &start, &end
		acc := int64(0)
		if p.Accrued != nil && p.Accrued.Currency == *w.Currency {
			acc = p.Accrued.AmountMinor
		}
		switch {
		case wl.open[w.AllocationID]:
			p.State = CostAccruing
			left := end.Sub(now)
			if left < 0 {
				left = 0
			}
			// The quoted hourly rate for the rest of the period, in whole minor units
			// rounded up (a projection errs on the side of the bill).
			more := (*w.HourlyRate*left.Milliseconds() + 3_599_999) / 3_600_000
			p.Projected = &billing.Money{AmountMinor: acc + more, Currency: *w.Currency}
		case w.ActiveAt == nil:
			p.State = CostPending
			p.Projected = &billing.Money{AmountMinor: 0, Currency: *w.Currency}
		default:
			p.State = CostStopped
			p.Projected = &billing.Money{AmountMinor: acc, Currency: *w.Currency}
		}
		if wl.runway >= 0 {
			secs := int64(wl.runway / time.Second)
			ends := now.UTC().Add(time.Duration(secs) * time.Second)
			p.RunwaySeconds, p.RunwayEndsAt, p.RunwaySource = &secs, &ends, RunwayBalance
		}
		out[w.AllocationID] = p
	}
	return out, nil
}

// budgetPeriod is the period of the budget that governs the project's spend in
// currency (its own active budget, else the tenant's), the UTC calendar month when none
// does: the period the budget engine evaluates (budgets.PeriodAt).
func (s *Service) budgetPeriod(ctx context.Context, tenantID, projectID uuid.UUID, currency string, now time.Time) (budgets.Window, error) {
	var period string
	var startsAt time.Time
	var endsAt *time.Time
	err := db.Querier(ctx, s.Pool).QueryRow(ctx, `
SELECT period, starts_at, ends_at FROM budgets
WHERE active AND tenant_id = $1 AND (project_id = $2 OR project_id IS NULL) AND currency = $3
  AND starts_at <= $4 AND (ends_at IS NULL OR ends_at > $4)
ORDER BY project_id IS NULL, created_at, id
LIMIT 1`, tenantID, projectID, currency, now).Scan(&period, &startsAt, &endsAt)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return budgets.Window{}, fmt.Errorf("budget period: %w", err)
	}
	if err == nil {
		if w, ok := budgets.PeriodAt(period, startsAt, endsAt, now); ok {
			return w, nil
		}
	}
	t := now.UTC()
	start := time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	return budgets.Window{Start: start, End: start.AddDate(0, 1, 0)}, nil
}
