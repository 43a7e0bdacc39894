package main

// The invoices benchmark (issue 24): close a period for 10,000 accounts × 100 rated usage
// lines each (goal <= 60 s), against the raw insert rate of the same 1,000,000 rated
// usage rows measured in the same run with the same number of writers. Each close reads
// its account's lines, builds the draft (totals checked), and writes the invoice, its 100
// lines and 100 claims, an audit row and its history in one transaction.

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing/invoices"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

func runInvoices(ctx context.Context, fx *fixture) error {
	accounts := envInt("GANTRY_BENCH_INVOICE_ACCOUNTS", 10_000)
	const perAccount, writers = 100, 8
	svc, err := invoices.New(fx.pool, clock.Real{}, ids.V7{}, fx.app.Billing.Ledger, nil, nil)
	if err != nil {
		return err
	}
	// Last month: closed periods only.
	thisMonth, _ := invoices.MonthOf(time.Now())
	start := thisMonth.AddDate(0, -1, 0)

	tenantIDs := make([]uuid.UUID, accounts)
	recordIDs := make([]uuid.UUID, accounts)
	for i := range tenantIDs {
		tenantIDs[i], recordIDs[i] = uuid.New(), uuid.New()
	}
	if _, err := fx.pool.Exec(ctx, `
		INSERT INTO tenants (id, name, slug, kind, created_at, updated_at)
		SELECT id, 'inv bench ' || n, 'inv-bench-' || n, 'organization', now(), now()
		FROM unnest($1::uuid[]) WITH ORDINALITY AS t(id, n)`, tenantIDs); err != nil {
		return err
	}
	if _, err := fx.pool.Exec(ctx, `
		INSERT INTO billing_usage_records (id, tenant_id, requested_by_user_id, source, source_id, usage_unit, quantity, currency,
		                                   bill_from, bill_to, rated_through, seg_from, created_at, updated_at)
		SELECT r, t, gen_random_uuid(), 'allocation', gen_random_uuid(), 'gpu.h100', 1, 'USD', $3::timestamptz, $3::timestamptz + interval '100 hours',
		       $3::timestamptz + interval '100 hours', $3::timestamptz, now(), now()
		FROM unnest($1::uuid[], $2::uuid[]) AS u(r, t)`, recordIDs, tenantIDs, start); err != nil {
		return err
	}
	if _, err := fx.pool.Exec(ctx, `
		INSERT INTO billing_rating_events (rating_key, usage_record_id, through, cumulative_quantity_millis, created_at)
		SELECT r::text || ':bench', r, $2::timestamptz + interval '100 hours', 360000000, now() FROM unnest($1::uuid[]) AS r`, recordIDs, start); err != nil {
		return err
	}

	// Raw insert: the 1,000,000 rated usage rows, one account's 100 rows per statement,
	// `writers` at once.
	fmt.Printf("invoices: close a period for %d accounts x %d usage lines (%d writers), vs raw inserts of the same rows; load %s\n",
		accounts, perAccount, writers, loadavg())
	forEach := func(fn func(i int) error) (time.Duration, error) {
		var next atomic.Int64
		var wg sync.WaitGroup
		var mu sync.Mutex
		var first error
		t0 := time.Now()
		for range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1)) - 1
					if i >= accounts {
						return
					}
					if err := fn(i); err != nil {
						mu.Lock()
						if first == nil {
							first = err
						}
						mu.Unlock()
						return
					}
				}
			}()
		}
		wg.Wait()
		return time.Since(t0), first
	}
	rawTime, err := forEach(func(i int) error {
		_, err := fx.pool.Exec(ctx, `
			INSERT INTO billing_rated_usage_lines (id, usage_record_id, tenant_id, requested_by_user_id, usage_source, usage_unit,
				segment_from, bill_from, bill_to, unit_quantity_millis, units, cumulative_units, currency, unit_price, amount_minor,
				amount_exact, cumulative_amount_minor, pricing_source, pricing_snapshot, rating_event_key, rating_key, created_at)
			SELECT gen_random_uuid(), $1::uuid, $2::uuid, $2::uuid, 'allocation', 'gpu.h100', $3::timestamptz, $3::timestamptz + n * interval '1 hour', $3::timestamptz + (n + 1) * interval '1 hour',
				3600000, 3600, 3600 * n, 'USD', '0.01', 36 + n, (36 + n)::text, 36 * n, 'plan', '{}', $1::uuid::text || ':bench',
				$1::uuid::text || ':bench/' || n, now()
			FROM generate_series(0, $4::int - 1) AS n`, recordIDs[i], tenantIDs[i], start, perAccount)
		return err
	})
	if err != nil {
		return fmt.Errorf("raw insert: %w", err)
	}
	rows := accounts * perAccount
	rawRate := float64(rows) / rawTime.Seconds()
	fmt.Printf("  raw insert of %d rated usage rows: %.2fs (%.0f rows/s)\n", rows, rawTime.Seconds(), rawRate)

	closeTime, err := forEach(func(i int) error {
		c, err := svc.Close(ctx, invoices.Period{TenantID: tenantIDs[i], Currency: "USD", Start: start, End: thisMonth})
		if err == nil && len(c.Invoice.Lines) != perAccount {
			err = fmt.Errorf("account %d: %d lines", i, len(c.Invoice.Lines))
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("close: %w", err)
	}
	var n, lines int
	var total int64
	if err := fx.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(total_minor), 0) FROM billing_invoices`).Scan(&n, &total); err != nil {
		return err
	}
	if err := fx.pool.QueryRow(ctx, `SELECT count(*) FROM billing_invoice_lines`).Scan(&lines); err != nil {
		return err
	}
	// Σ over n in 0..99 of 36 + n = 3600 + 4950 per account.
	if n != accounts || lines != rows || total != int64(accounts)*(3600+4950) {
		return fmt.Errorf("close: %d invoices, %d lines, total %d", n, lines, total)
	}
	verdict := "meets"
	if closeTime > 60*time.Second {
		verdict = "misses"
	}
	closeRate := float64(rows) / closeTime.Seconds()
	fmt.Printf("  closed %d accounts (%d invoice lines) in %.2fs (%.0f accounts/s, %.0f lines/s; goal <= 60s: %s)\n",
		accounts, lines, closeTime.Seconds(), float64(accounts)/closeTime.Seconds(), closeRate, verdict)
	fmt.Printf("  close lines/s / raw insert rows/s = %.2fx; load after %s\n", closeRate/rawRate, loadavg())
	return nil
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
