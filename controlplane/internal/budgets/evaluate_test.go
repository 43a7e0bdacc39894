package budgets_test

import (
	"context"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/budgets"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Dedupe: within a period, re-evaluation counts sightings of the same event; a higher
// level is a new event; a new period is a new event; status never moves backwards.
func TestEvaluateDedupesAcrossReevaluationsAndPeriods(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	b := f.create(tenantBudget("monthly cap", budgets.ModeNotifyOnly, 1000_00, 80))

	// Under the threshold: nothing.
	f.spend.set(nil, "USD", 799_99)
	if ev := f.evaluate(); ev.Budgets != 1 || ev.Opened != 0 || ev.Seen != 0 {
		t.Fatalf("under threshold: %+v", ev)
	}
	if n := len(f.events(b.ID)); n != 0 {
		t.Fatalf("events under threshold: %d", n)
	}

	// Exactly 80 %: the threshold event opens.
	f.spend.set(nil, "USD", 800_00)
	if ev := f.evaluate(); ev.Opened != 1 {
		t.Fatalf("at threshold: %+v", ev)
	}
	first := f.events(b.ID)
	if len(first) != 1 || first[0].ThresholdKey != "percent_80" || first[0].SeenCount != 1 || first[0].PercentUsed != 80 ||
		!first[0].PeriodStart.Equal(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)) || !first[0].FirstSeenAt.Equal(t0) {
		t.Fatalf("threshold event: %+v", first)
	}

	// Re-evaluations: same event, seen_count and last_seen_at move, first_seen_at stays.
	for i := 2; i <= 3; i++ {
		f.clk.Advance(time.Hour)
		f.spend.set(nil, "USD", 850_00)
		if ev := f.evaluate(); ev.Opened != 0 || ev.Seen != 1 {
			t.Fatalf("re-evaluation %d: %+v", i, ev)
		}
		got := f.events(b.ID)
		if len(got) != 1 || got[0].ID != first[0].ID || int(got[0].SeenCount) != i ||
			!got[0].LastSeenAt.Equal(f.clk.Now()) || !got[0].FirstSeenAt.Equal(t0) || got[0].SpentMinor != 850_00 {
			t.Fatalf("re-evaluation %d: %+v", i, got)
		}
	}
	if n := f.outbox(budgets.EventThresholdCrossed); n != 1 {
		t.Fatalf("threshold_crossed events: %d, want 1", n)
	}

	// Acknowledged, then seen again: still acknowledged (status never moves here).
	if _, err := f.svc.Acknowledge(ctx, f.admin, first[0].ID); err != nil {
		t.Fatal(err)
	}
	f.clk.Advance(time.Hour)
	f.evaluate()
	if got := f.events(b.ID); got[0].Status != budgets.StatusAcknowledged || got[0].SeenCount != 4 {
		t.Fatalf("after acknowledge + evaluate: %+v", got[0])
	}

	// A higher level (exactly 100 %) is a new event in the same period.
	f.spend.set(nil, "USD", 1000_00)
	f.clk.Advance(time.Hour)
	if ev := f.evaluate(); ev.Opened != 1 {
		t.Fatalf("at 100 %%: %+v", ev)
	}
	got := f.events(b.ID)
	if len(got) != 2 || got[1].ThresholdKey != "percent_100" || got[1].SeenCount != 1 || got[1].Status != budgets.StatusOpen {
		t.Fatalf("100 %% event: %+v", got)
	}
	if got[0].SeenCount != 4 {
		t.Fatalf("the 80 %% event is not seen again once 100 %% is reached: %+v", got[0])
	}
	f.evaluate()
	if got := f.events(b.ID); len(got) != 2 || got[1].SeenCount != 2 {
		t.Fatalf("re-evaluation at 100 %%: %+v", got)
	}

	// The posture shows the latest event.
	list, err := f.svc.List(ctx, f.admin, budgets.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].LatestEvent == nil || list[0].LatestEvent.ID != got[1].ID {
		t.Fatalf("latest event: %+v", list)
	}

	// A new period: a new event, even for the same key.
	f.clk.Set(time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC))
	if ev := f.evaluate(); ev.Opened != 1 {
		t.Fatalf("new period: %+v", ev)
	}
	got = f.events(b.ID)
	if len(got) != 3 || got[2].ThresholdKey != "percent_100" || !got[2].PeriodStart.Equal(time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)) || got[2].SeenCount != 1 {
		t.Fatalf("new period event: %+v", got)
	}
	if n := f.outbox(budgets.EventThresholdCrossed); n != 3 {
		t.Fatalf("threshold_crossed events: %d, want 3", n)
	}
	if n := f.count(`SELECT count(*) FROM audit_events WHERE action = 'budget.threshold_crossed'`); n != 3 {
		t.Fatalf("audit rows of opened events: %d, want 3 (sightings are not audited)", n)
	}
}

// Each enforcement mode, measured at exactly 100 %.
func TestEnforcementModes(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	project := f.org.Project.ID
	launch := func() budgets.Decision {
		t.Helper()
		d, err := f.svc.DecideLaunch(ctx, f.org.Tenant.ID, project, budgets.Money{AmountMinor: 0, Currency: "USD"})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}

	t.Run("notify_only never blocks", func(t *testing.T) {
		b := f.create(tenantBudget("notify", budgets.ModeNotifyOnly, 100_00, 80))
		f.spend.set(nil, "USD", 250_00) // far over
		d := launch()
		if d.Blocked() || d.Outcome != budgets.DecisionWarn || d.Err() != nil || d.Items[0].Reason != budgets.ReasonBudgetExceeded {
			t.Fatalf("notify_only: %+v", d)
		}
		f.evaluate()
		if n := f.outbox(budgets.EventSuspendRequested); n != 0 {
			t.Fatalf("notify_only asked for a suspension")
		}
		f.deleteBudget(b.ID)
	})

	t.Run("block_launch blocks new launches only", func(t *testing.T) {
		b := f.create(tenantBudget("block", budgets.ModeBlockLaunch, 100_00, 80))
		f.spend.set(nil, "USD", 99_99)
		d, err := f.svc.DecideLaunch(ctx, f.org.Tenant.ID, project, budgets.Money{AmountMinor: 0, Currency: "USD"})
		if err != nil || d.Blocked() {
			t.Fatalf("99.99 %%: %+v %v", d, err)
		}
		// A launch that would bring spend to exactly 100 % is refused.
		d, err = f.svc.DecideLaunch(ctx, f.org.Tenant.ID, project, budgets.Money{AmountMinor: 1, Currency: "USD"})
		if err != nil || !d.Blocked() || d.Blocking == nil || d.Blocking.BudgetID != b.ID {
			t.Fatalf("launch to exactly 100 %%: %+v %v", d, err)
		}
		e := wantCode(t, d.Err(), apierr.InvalidRequest, 409)
		if e.Details["reason"] != "budget_exceeded" || e.Details["budget_id"] != b.ID.String() || e.Details["enforcement_mode"] != "block_launch" {
			t.Fatalf("refusal details: %v", e.Details)
		}
		// A launch in another currency adds nothing to a USD budget.
		if d, _ := f.svc.DecideLaunch(ctx, f.org.Tenant.ID, project, budgets.Money{AmountMinor: 1_000_000, Currency: "EUR"}); d.Blocked() {
			t.Fatalf("EUR proposal counted against a USD budget: %+v", d)
		}
		// Running workloads are left alone: exhausted, evaluated, no suspension.
		f.spend.set(nil, "USD", 100_00)
		if !launch().Blocked() {
			t.Fatal("exactly 100 % spent must block new launches")
		}
		f.evaluate()
		if n := f.outbox(budgets.EventSuspendRequested); n != 0 {
			t.Fatalf("block_launch asked for a suspension")
		}
		f.deleteBudget(b.ID)
	})

	t.Run("suspend asks for running workloads to stop", func(t *testing.T) {
		p := f.org.Project.ID
		in := budgets.NewBudget{
			ScopeType: budgets.ScopeProject, ProjectID: &p, Name: "suspend", Period: budgets.PeriodMonthly,
			Amount: budgets.Money{AmountMinor: 100_00, Currency: "USD"}, EnforcementMode: ptr(budgets.ModeSuspend),
		}
		b := f.create(in)
		f.spend.set(&p, "USD", 99_99)
		f.evaluate() // 99.99 %: the 80 % event, no suspension
		if n := f.outbox(budgets.EventSuspendRequested); n != 0 {
			t.Fatalf("suspension under 100 %%")
		}
		f.spend.set(&p, "USD", 100_00)
		if ev := f.evaluate(); ev.SuspendRequested != 1 {
			t.Fatalf("at 100 %%: %+v", ev)
		}
		got := f.outboxPayloads(budgets.EventSuspendRequested)
		if len(got) != 1 || got[0]["budget_id"] != b.ID.String() || got[0]["project_id"] != p.String() ||
			got[0]["scope_type"] != "project" || got[0]["tenant_id"] != f.org.Tenant.ID.String() || got[0]["threshold_key"] != "percent_100" {
			t.Fatalf("suspend_requested: %+v", got)
		}
		var subject string
		if err := f.pool.QueryRow(ctx, `SELECT subject FROM outbox_events WHERE event_type = $1`, budgets.EventSuspendRequested).Scan(&subject); err != nil || subject != "gantry.events.budget.suspend_requested" {
			t.Fatalf("subject %q %v", subject, err)
		}
		// Asked once per event, not once per evaluation.
		f.clk.Advance(time.Minute)
		f.evaluate()
		if n := f.outbox(budgets.EventSuspendRequested); n != 1 {
			t.Fatalf("suspend_requested events after re-evaluation: %d", n)
		}
		// Suspend also blocks launches in its project, and not elsewhere.
		if !launch().Blocked() {
			t.Fatal("suspend must block launches in its project")
		}
		other, err := f.tenancy.CreateProject(ctx, f.admin, tenancyProject("other"))
		if err != nil {
			t.Fatal(err)
		}
		if d, _ := f.svc.DecideLaunch(ctx, f.org.Tenant.ID, other.ID, budgets.Money{Currency: "USD"}); d.Blocked() || len(d.Items) != 0 {
			t.Fatalf("a project budget applied to another project: %+v", d)
		}
		if n := f.count(`SELECT count(*) FROM audit_events WHERE action = 'budget.suspend_requested'`); n != 1 {
			t.Fatalf("suspend audit rows: %d", n)
		}
	})

	t.Run("a budget switched to suspend after 100 % asks once", func(t *testing.T) {
		b := f.create(tenantBudget("late", budgets.ModeNotifyOnly, 10_00, 80))
		f.spend.set(nil, "USD", 10_00)
		f.evaluate()
		before := f.outbox(budgets.EventSuspendRequested)
		if _, err := f.svc.Update(ctx, f.admin, b.ID, budgets.Patch{EnforcementMode: ptr(budgets.ModeSuspend)}); err != nil {
			t.Fatal(err)
		}
		f.evaluate()
		f.evaluate()
		if n := f.outbox(budgets.EventSuspendRequested); n != before+1 {
			t.Fatalf("suspend_requested: %d, want %d", n, before+1)
		}
	})
}

// Spend is only ever asked for, and compared, in each budget's own currency.
func TestCurrenciesAreNeverMixed(t *testing.T) {
	f := newFixture(t)
	eur := tenantBudget("eur", budgets.ModeBlockLaunch, 50_00, 80)
	eur.Amount.Currency = "EUR"
	f.create(eur)
	f.create(tenantBudget("usd", budgets.ModeBlockLaunch, 50_00, 80))
	jpy := tenantBudget("jpy", budgets.ModeBlockLaunch, 5000, 80)
	jpy.Amount.Currency = "JPY"
	f.create(jpy)
	f.spend.set(nil, "USD", 49_99)
	f.spend.set(nil, "EUR", 10_00)
	d, err := f.svc.DecideLaunch(context.Background(), f.org.Tenant.ID, f.org.Project.ID, budgets.Money{AmountMinor: 1, Currency: "USD"})
	if err != nil {
		t.Fatal(err)
	}
	if !d.Blocked() || d.Blocking.Name != "usd" || len(d.Items) != 3 {
		t.Fatalf("decision: %+v", d)
	}
	for _, it := range d.Items {
		for _, m := range []budgets.Money{it.Spent, it.Proposed, it.Projected, it.Budget} {
			if m.Currency != it.Budget.Currency {
				t.Fatalf("item %s mixes %s into %s", it.Name, m.Currency, it.Budget.Currency)
			}
		}
		if it.Name != "usd" && it.Proposed.AmountMinor != 0 {
			t.Fatalf("a USD proposal counted against %s: %+v", it.Name, it)
		}
	}
	asked := map[string]bool{}
	for _, q := range f.spend.questions() {
		asked[q] = true
	}
	if len(asked) != 3 || !asked["tenant/USD"] || !asked["tenant/EUR"] || !asked["tenant/JPY"] {
		t.Fatalf("spend asked for %v", asked)
	}
}

func TestDecideLaunchRefusesBadProposal(t *testing.T) {
	f := newFixture(t)
	for _, m := range []budgets.Money{{AmountMinor: -1, Currency: "USD"}, {AmountMinor: 1, Currency: "usd"}, {AmountMinor: 1_000_000_000_000_001, Currency: "USD"}} {
		_, err := f.svc.DecideLaunch(context.Background(), f.org.Tenant.ID, f.org.Project.ID, m)
		wantCode(t, err, apierr.ValidationError, 422)
	}
}

// Concurrent evaluations of one budget open one event and ask for one suspension.
func TestConcurrentEvaluationsDedupe(t *testing.T) {
	f := newFixture(t)
	b := f.create(tenantBudget("race", budgets.ModeSuspend, 100_00, 50))
	f.spend.set(nil, "USD", 120_00)
	const n = 8
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := f.svc.Evaluate(context.Background(), f.org.Tenant.ID)
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	got := f.events(b.ID)
	if len(got) != 1 || got[0].SeenCount != n {
		t.Fatalf("events: %+v", got)
	}
	if s := f.outbox(budgets.EventSuspendRequested); s != 1 {
		t.Fatalf("suspend_requested: %d", s)
	}
	if s := f.outbox(budgets.EventThresholdCrossed); s != 1 {
		t.Fatalf("threshold_crossed: %d", s)
	}
}

// Inactive budgets and budgets outside their dates are neither evaluated nor applied.
func TestInactiveAndOutOfWindowBudgets(t *testing.T) {
	f := newFixture(t)
	off := tenantBudget("off", budgets.ModeBlockLaunch, 1, 80)
	off.Active = ptr(false)
	f.create(off)
	future := tenantBudget("future", budgets.ModeBlockLaunch, 1, 80)
	future.StartsAt = ptr(t0.Add(24 * time.Hour))
	f.create(future)
	past := tenantBudget("past", budgets.ModeBlockLaunch, 1, 80)
	past.Period = budgets.PeriodCustom
	past.StartsAt, past.EndsAt = ptr(t0.Add(-48*time.Hour)), ptr(t0)
	f.create(past)
	f.spend.set(nil, "USD", 1000)
	d, err := f.svc.DecideLaunch(context.Background(), f.org.Tenant.ID, f.org.Project.ID, budgets.Money{AmountMinor: 1, Currency: "USD"})
	if err != nil || d.Blocked() || len(d.Items) != 0 {
		t.Fatalf("decision: %+v %v", d, err)
	}
	if ev := f.evaluate(); ev.Budgets != 0 || ev.Opened != 0 {
		t.Fatalf("evaluation: %+v", ev)
	}
}

// EvaluateAll (the loop's pass) covers every tenant with an active budget.
func TestEvaluateAll(t *testing.T) {
	f := newFixture(t)
	b := f.create(tenantBudget("all", budgets.ModeNotifyOnly, 10_00, 50))
	f.spend.set(nil, "USD", 5_00)
	ev, err := f.svc.EvaluateAll(context.Background())
	if err != nil || ev.Budgets != 1 || ev.Opened != 1 {
		t.Fatalf("EvaluateAll: %+v %v", ev, err)
	}
	if got := f.events(b.ID); len(got) != 1 || got[0].ThresholdKey != "percent_50" {
		t.Fatalf("events: %+v", got)
	}
}
