package invoices_test

import (
	"context"
	"testing"
	"time"

	"github.com/riverqueue/river"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing/invoices"
	"github.com/gantry-gpu/gantry/controlplane/internal/jobs"
)

// The period close runs as River jobs on a real runner: the fan-out inserts one close
// per tenant and currency with activity, each builds its draft once; running the
// fan-out again adds nothing.
func TestClosePeriodJobs(t *testing.T) {
	f := newFixture(t)
	a, pa := f.tenant()
	b, pb := f.tenant()
	idle, _ := f.tenant()
	_ = idle
	f.topUp(a, "USD", 10000)
	f.usage(a, pa, "USD", 1, midMarch, midMarch.Add(time.Minute))
	f.usage(a, pa, "EUR", 1, midMarch, midMarch.Add(time.Minute))
	f.usage(b, pb, "USD", 2, midMarch, midMarch.Add(time.Minute))
	f.clk.Set(april.Add(time.Hour))

	r, err := jobs.New(f.pool, jobs.Config{FetchPollInterval: 50 * time.Millisecond, StopTimeout: 5 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.svc.Register(r, time.Hour) // the periodic job runs at start: it closes March
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil && err != context.Canceled {
			t.Errorf("runner: %v", err)
		}
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("gave up waiting for %s", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFor("three March invoices", func() bool {
		return f.count(`SELECT count(*) FROM billing_invoices WHERE period_start = $1 AND period_end = $2`, march, april) == 3
	})
	waitFor("the close jobs to complete", func() bool {
		return f.count(`SELECT count(*) FROM river_job WHERE kind = 'invoice_close' AND state = 'completed'`) == 3
	})
	// The fan-out again: every account is closed, so it finds nothing to do.
	if p, err := f.svc.Pending(f.ctx, march, april); err != nil || len(p) != 0 {
		t.Fatalf("pending after the close: %v %+v", err, p)
	}
	fan := &invoices.ClosePeriodWorker{Svc: f.svc, Jobs: r}
	if err := fan.Work(f.ctx, &river.Job[invoices.ClosePeriodArgs]{Args: invoices.ClosePeriodArgs{PeriodStart: march, PeriodEnd: april}}); err != nil {
		t.Fatal(err)
	}
	if n := f.count(`SELECT count(*) FROM river_job WHERE kind = 'invoice_close'`); n != 3 {
		t.Fatalf("%d close jobs after a re-run", n)
	}
	if n := f.count(`SELECT count(*) FROM billing_invoices`); n != 3 {
		t.Fatalf("%d invoices", n)
	}
	// A close job for a period that overlaps is cancelled, not retried forever.
	if _, err := r.Insert(f.ctx, invoices.CloseArgs{TenantID: a, Currency: "USD", PeriodStart: march.AddDate(0, 0, 10), PeriodEnd: april.AddDate(0, 0, -1)}, nil); err != nil {
		t.Fatal(err)
	}
	waitFor("the overlapping close to be cancelled", func() bool {
		return f.count(`SELECT count(*) FROM river_job WHERE kind = 'invoice_close' AND state = 'cancelled'`) == 1
	})
}
