package main

// The billing benchmarks (issue 3):
//
//   - rating: 1,000,000 usage-seconds spread over 10,000 running allocations (100 s each,
//     100 tenants) rated into the ledger by one RateRunning pass (goal <= 10 s);
//   - ledger postings per second with 16 concurrent writers (each posting a balanced
//     two-leg transaction with its wallet projection update, in its own database
//     transaction) vs raw single-row inserts from 16 writers, measured in the same run.

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
)

func runBilling(ctx context.Context, fx *fixture, dur time.Duration, rounds int) error {
	svc := fx.app.Billing
	now := time.Now().UTC().Truncate(time.Second)
	eff := now.Add(-24 * time.Hour)
	if _, err := svc.CreatePlan(ctx, "bench", true, &eff, []billing.PriceInput{{Unit: "gpu.h100", Currency: "USD", UnitPrice: "0.000694444444"}}); err != nil {
		return err
	}
	const tenants, runs, seconds = 100, 10_000, 100
	tenantIDs := make([]uuid.UUID, tenants)
	for i := range tenantIDs {
		tenantIDs[i] = uuid.New()
	}
	if _, err := fx.pool.Exec(ctx, `
		INSERT INTO tenants (id, name, slug, kind, created_at, updated_at)
		SELECT id, 'bench ' || n, 'bench-' || n, 'organization', now(), now()
		FROM unnest($1::uuid[]) WITH ORDINALITY AS t(id, n)`, tenantIDs); err != nil {
		return err
	}
	for _, t := range tenantIDs {
		if _, err := svc.Adjust(ctx, billing.Adjustment{TenantID: t, Money: billing.Money{AmountMinor: 100_000_000, Currency: "USD"}, Reason: "bench"}); err != nil {
			return err
		}
	}
	if _, err := fx.pool.Exec(ctx, `
		INSERT INTO billing_usage_records (id, tenant_id, requested_by_user_id, source, source_id, usage_unit, quantity, currency,
		                                   bill_from, rated_through, seg_from, created_at, updated_at)
		SELECT gen_random_uuid(), ($1::uuid[])[1 + n % $2], gen_random_uuid(), 'allocation', gen_random_uuid(), 'gpu.h100', 1, 'USD',
		       $3, $3, $3, now(), now()
		FROM generate_series(1, $4) AS n`, tenantIDs, tenants, now.Add(-seconds*time.Second), runs); err != nil {
		return err
	}
	fmt.Printf("billing: rate %d usage-seconds over %d running allocations (%d tenants)\n", runs*seconds, runs, tenants)
	start := time.Now()
	st, err := svc.RateRunning(ctx, now, 500)
	if err != nil {
		return err
	}
	el := time.Since(start)
	var revenue int64
	if err := fx.pool.QueryRow(ctx, `SELECT coalesce(sum(amount_minor), 0) FROM billing_rated_usage_lines`).Scan(&revenue); err != nil {
		return err
	}
	verdict := "meets"
	if el > 10*time.Second {
		verdict = "misses"
	}
	fmt.Printf("  rated %d runs into %d lines, %d cents, in %.2fs (%.0f runs/s, %.0f usage-seconds/s; goal <= 10s: %s)\n",
		st.Records, st.Lines, revenue, el.Seconds(), float64(st.Records)/el.Seconds(), float64(runs*seconds)/el.Seconds(), verdict)
	if st.Records != runs || revenue != int64(runs)*7 { // 100 s × 0.000694444444 = 0.0694… → 7 cents each
		return fmt.Errorf("rating: %d runs, %d cents", st.Records, revenue)
	}

	// Postings vs raw inserts, 16 writers each.
	const writers = 16
	if _, err := fx.pool.Exec(ctx, `CREATE TABLE bench_raw_inserts (id uuid PRIMARY KEY, v bigint NOT NULL, created_at timestamptz NOT NULL)`); err != nil {
		return err
	}
	raw := func() float64 {
		return throughput(dur, writers, func() {
			if _, err := fx.pool.Exec(ctx, `INSERT INTO bench_raw_inserts (id, v, created_at) VALUES ($1, $2, now())`, uuid.New(), 1); err != nil {
				panic(err)
			}
		})
	}
	post := func() float64 {
		return throughput(dur, writers, func() {
			// Writers spread over the tenants' wallets (some contention, as in production).
			i := int(time.Now().UnixNano()) % tenants
			if i < 0 {
				i = -i
			}
			t := tenantIDs[i]
			err := db.InTx(ctx, fx.pool, func(tx pgx.Tx) error {
				_, err := svc.Ledger.Post(ctx, tx, billing.Posting{
					Kind: billing.TxnAdjustment, TenantID: t, Reference: "bench:" + uuid.NewString(),
					Legs: []billing.Leg{
						{Account: billing.AccountKey{Kind: billing.AccountWallet, TenantID: t, Currency: "USD"}, Amount: 1},
						{Account: billing.AccountKey{Kind: billing.AccountAdjustments, Currency: "USD"}, Amount: -1},
					},
				})
				return err
			})
			if err != nil {
				panic(err)
			}
		})
	}
	r := pair(rounds, raw, post)
	fmt.Printf("billing: ledger postings, %d concurrent writers\n  baseline (raw single-row INSERT, autocommit): %.0f inserts/s\n  ledger postings (txn + 2 entries + projection, checked at commit): %.0f postings/s\n  ratio postings/raw inserts = %.2fx\n\n",
		writers, r[0], r[1], r[1]/r[0])
	return nil
}
