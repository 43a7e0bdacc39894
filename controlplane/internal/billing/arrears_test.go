package billing

import (
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

func (f *fixture) receivable(tenant uuid.UUID, cur string) int64 {
	f.t.Helper()
	n, err := f.svc.Ledger.Arrears(f.ctx, f.pool, tenant, cur)
	if err != nil {
		f.t.Fatal(err)
	}
	return -n
}

// Usage the wallet could not cover is settled first when money arrives (a top-up or an
// admin credit); only the rest grows the balance; a tenant in arrears cannot launch and
// the launch check says why.
func TestArrearsSettledBeforeBalanceGrows(t *testing.T) {
	f := newFixture(t)
	f.defaultPlan()
	tenant, project := f.tenant("USD")
	f.topUp(tenant, "USD", 1000)
	rec := f.start(tenant, project, 8, t0)
	f.clock.Set(t0.Add(time.Hour))
	if _, err := f.svc.StopUsage(f.ctx, nil, SourceAllocation, rec.SourceID, f.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if f.wallet(tenant, "USD") != 0 || f.receivable(tenant, "USD") != -1000 {
		t.Fatalf("after usage: wallet %d receivable %d", f.wallet(tenant, "USD"), f.receivable(tenant, "USD"))
	}

	// In arrears: the launch check refuses, naming the arrears.
	d, err := f.svc.CanLaunch(f.ctx, tenant, project, "gpu.h100", 1, "")
	if err != nil || d.Allowed || d.Arrears != 1000 {
		t.Fatalf("decision in arrears: %+v %v", d, err)
	}
	wantCode(t, d.Err(), apierr.InsufficientBalance, "arrears")

	// A top-up smaller than the arrears goes entirely to them.
	f.topUp(tenant, "USD", 400)
	if f.wallet(tenant, "USD") != 0 || f.receivable(tenant, "USD") != -600 {
		t.Fatalf("partial settle: wallet %d receivable %d", f.wallet(tenant, "USD"), f.receivable(tenant, "USD"))
	}
	// An admin credit settles the rest first; only the remainder reaches the wallet.
	if _, err := f.svc.Adjust(f.ctx, Adjustment{TenantID: tenant, Money: Money{AmountMinor: 700, Currency: "USD"}, Reason: "goodwill"}); err != nil {
		t.Fatal(err)
	}
	if f.wallet(tenant, "USD") != 100 || f.receivable(tenant, "USD") != 0 {
		t.Fatalf("settled: wallet %d receivable %d", f.wallet(tenant, "USD"), f.receivable(tenant, "USD"))
	}
	// Other currencies are untouched by USD arrears, and vice versa.
	f.topUp(tenant, "EUR", 500)
	if f.wallet(tenant, "EUR") != 500 {
		t.Fatalf("EUR wallet %d", f.wallet(tenant, "EUR"))
	}
	d, err = f.svc.CanLaunch(f.ctx, tenant, project, "gpu.h100", 1, "")
	if err != nil || d.Arrears != 0 {
		t.Fatalf("decision after settling: %+v %v", d, err)
	}
	if e, ok := apierr.As(d.Err()); ok && e.Details["reason"] == "arrears" {
		t.Fatalf("still refused for arrears: %v", d.Err())
	}
	// The settling legs are in the top-up's own transaction: every posting balances.
	var n int
	if err := f.pool.QueryRow(f.ctx, `SELECT count(*) FROM billing_ledger_entries e JOIN billing_ledger_accounts a ON a.id = e.account_id
		WHERE a.tenant_id = $1 AND a.kind = 'tenant_receivable' AND e.amount_minor > 0`, tenant).Scan(&n); err != nil || n != 2 {
		t.Fatalf("settling entries: %d %v", n, err)
	}
	f.checkInvariants()
}

// Concurrent top-ups never settle the same arrears twice: the receivable never goes
// above zero and wallet + receivable = money in - usage.
func TestArrearsConcurrentCredits(t *testing.T) {
	f := newFixture(t)
	f.defaultPlan()
	tenant, project := f.tenant("USD")
	rec := f.start(tenant, project, 8, t0)
	f.clock.Set(t0.Add(time.Hour))
	if _, err := f.svc.StopUsage(f.ctx, nil, SourceAllocation, rec.SourceID, f.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if f.receivable(tenant, "USD") != -2000 {
		t.Fatalf("receivable %d", f.receivable(tenant, "USD"))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- db.InTx(f.ctx, f.pool, func(tx pgx.Tx) error {
				_, err := f.svc.Ledger.CreditTopUp(f.ctx, tx, tenant, "USD", 300, uuid.New())
				return err
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if f.receivable(tenant, "USD") != 0 || f.wallet(tenant, "USD") != 1000 {
		t.Fatalf("after 10 x 300: wallet %d receivable %d", f.wallet(tenant, "USD"), f.receivable(tenant, "USD"))
	}
	f.checkInvariants()
}
