package invoices

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/riverqueue/river"

	"github.com/gantry-gpu/gantry/controlplane/internal/jobs"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// CloseArgs is the River job that closes one account's period in one currency.
type CloseArgs struct {
	TenantID    uuid.UUID `json:"tenant_id"`
	Currency    string    `json:"currency"`
	PeriodStart time.Time `json:"period_start"`
	PeriodEnd   time.Time `json:"period_end"`
}

// Kind implements river.JobArgs.
func (CloseArgs) Kind() string { return "invoice_close" }

// InsertOpts: one job per account, currency and period while it is pending or running
// (and the close itself is idempotent, so a later duplicate finds the invoice).
func (CloseArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: 10, UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

// CloseWorker works CloseArgs: Service.Close. A refusal that retrying cannot change (an
// overlapping period, an account that may not be invoiced, a bad tax profile) cancels
// the job; anything else is retried with River's backoff.
type CloseWorker struct {
	river.WorkerDefaults[CloseArgs]
	Svc *Service
}

// Work implements river.Worker.
func (w *CloseWorker) Work(ctx context.Context, j *river.Job[CloseArgs]) error {
	_, err := w.Svc.Close(ctx, Period{TenantID: j.Args.TenantID, Currency: j.Args.Currency, Start: j.Args.PeriodStart, End: j.Args.PeriodEnd})
	var e *apierr.Error
	if errors.As(err, &e) && e.HTTPStatus() < 500 {
		return river.JobCancel(err)
	}
	return err
}

// ClosePeriodArgs is the job that fans a period out: one CloseArgs per tenant and
// currency with usage or ledger activity not yet invoiced before the period's end.
type ClosePeriodArgs struct {
	PeriodStart time.Time `json:"period_start"`
	PeriodEnd   time.Time `json:"period_end"`
}

// Kind implements river.JobArgs.
func (ClosePeriodArgs) Kind() string { return "invoice_close_period" }

// InsertOpts: one fan-out per period while pending or running.
func (ClosePeriodArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

// ClosePeriodWorker works ClosePeriodArgs.
type ClosePeriodWorker struct {
	river.WorkerDefaults[ClosePeriodArgs]
	Svc  *Service
	Jobs *jobs.Runner
}

// Work implements river.Worker: the accounts to close are read and their jobs inserted
// in batches; re-running it inserts nothing new for periods already closed.
func (w *ClosePeriodWorker) Work(ctx context.Context, j *river.Job[ClosePeriodArgs]) error {
	pending, err := w.Svc.Pending(ctx, j.Args.PeriodStart, j.Args.PeriodEnd)
	if err != nil {
		return err
	}
	const batch = 1000
	for i := 0; i < len(pending); i += batch {
		params := make([]river.InsertManyParams, 0, batch)
		for _, p := range pending[i:min(i+batch, len(pending))] {
			params = append(params, river.InsertManyParams{Args: CloseArgs{TenantID: p.TenantID, Currency: p.Currency,
				PeriodStart: p.Start, PeriodEnd: p.End}})
		}
		if _, err := w.Jobs.Client().InsertMany(ctx, params); err != nil {
			return fmt.Errorf("insert close jobs: %w", err)
		}
	}
	return nil
}

// Pending is every (tenant, currency) with rated usage or a non-usage ledger transaction
// before end that no invoice claims, and no invoice for a period overlapping [start, end).
func (s *Service) Pending(ctx context.Context, start, end time.Time) ([]Period, error) {
	rows, err := s.Pool.Query(ctx, `
		WITH candidates AS (
			SELECT DISTINCT l.tenant_id, l.currency FROM billing_rated_usage_lines l
			WHERE l.bill_from < $2 AND NOT EXISTS (SELECT 1 FROM billing_invoice_lines c WHERE c.rated_usage_line_id = l.id)
			UNION
			SELECT DISTINCT t.tenant_id, e.currency FROM billing_ledger_transactions t
			JOIN billing_ledger_entries e ON e.txn_id = t.id
			WHERE t.tenant_id IS NOT NULL AND t.kind <> 'usage' AND t.created_at < $2
			  AND NOT EXISTS (SELECT 1 FROM billing_invoice_txn_claims c WHERE c.ledger_txn_id = t.id))
		SELECT c.tenant_id, c.currency FROM candidates c
		WHERE NOT EXISTS (SELECT 1 FROM billing_invoices i WHERE i.tenant_id = c.tenant_id AND i.currency = c.currency
			AND i.period_start < $2 AND i.period_end > $1)
		ORDER BY 1, 2`, start, end)
	if err != nil {
		return nil, fmt.Errorf("pending closes: %w", err)
	}
	defer rows.Close()
	var out []Period
	for rows.Next() {
		p := Period{Start: start, End: end}
		if err := rows.Scan(&p.TenantID, &p.Currency); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// Register adds the close workers to r and the daily job that closes the previous
// calendar month (UTC), run at start too: a replica that was down at the month's turn
// closes it when it comes back.
func (s *Service) Register(r *jobs.Runner, every time.Duration) {
	river.AddWorker(r.Workers(), &CloseWorker{Svc: s})
	river.AddWorker(r.Workers(), &ClosePeriodWorker{Svc: s, Jobs: r})
	if every <= 0 {
		every = 24 * time.Hour
	}
	r.AddPeriodic(river.NewPeriodicJob(river.PeriodicInterval(every), func() (river.JobArgs, *river.InsertOpts) {
		thisMonth, _ := MonthOf(s.Clock.Now())
		return ClosePeriodArgs{PeriodStart: thisMonth.AddDate(0, -1, 0), PeriodEnd: thisMonth}, nil
	}, &river.PeriodicJobOpts{RunOnStart: true}))
}
