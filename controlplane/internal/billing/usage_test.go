package billing

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing/billingdb"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// H100 at $2.50/GPU-hour = 0.000694444... per GPU-second; written with sub-minor precision.
const h100USD = "0.000694444444"

func (f *fixture) defaultPlan(prices ...PriceInput) Plan {
	f.t.Helper()
	if len(prices) == 0 {
		prices = []PriceInput{{Unit: "gpu.h100", Currency: "USD", UnitPrice: h100USD}, {Unit: "gpu.h100", Currency: "EUR", UnitPrice: "0.00064"}}
	}
	eff := t0.Add(-24 * time.Hour)
	p, err := f.svc.CreatePlan(f.ctx, "standard", true, &eff, prices)
	if err != nil {
		f.t.Fatal(err)
	}
	return p
}

func (f *fixture) start(tenant, project uuid.UUID, qty int64, at time.Time) UsageRecord {
	f.t.Helper()
	rec, err := f.svc.StartUsage(f.ctx, nil, UsageStart{Source: SourceAllocation, SourceID: uuid.New(), TenantID: tenant,
		ProjectID: project, UserID: uuid.New(), Unit: "gpu.h100", Quantity: qty, StartedAt: at})
	if err != nil {
		f.t.Fatal(err)
	}
	return rec
}

func (f *fixture) lines(record uuid.UUID) []billingdb.BillingRatedUsageLine {
	f.t.Helper()
	rows, err := f.pool.Query(f.ctx, `SELECT id, amount_minor, units, unit_quantity_millis, segment_from, ledger_entry_id, pricing_plan_version, rating_key
		FROM billing_rated_usage_lines WHERE usage_record_id = $1 ORDER BY bill_from, id`, record)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	var out []billingdb.BillingRatedUsageLine
	for rows.Next() {
		var l billingdb.BillingRatedUsageLine
		if err := rows.Scan(&l.ID, &l.AmountMinor, &l.Units, &l.UnitQuantityMillis, &l.SegmentFrom, &l.LedgerEntryID, &l.PricingPlanVersion, &l.RatingKey); err != nil {
			f.t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

func TestRatingKeyIdempotentAndConflicting(t *testing.T) {
	f := newFixture(t)
	f.defaultPlan()
	tenant, project := f.tenant("USD")
	f.topUp(tenant, "USD", 100_000)
	rec := f.start(tenant, project, 8, t0)
	at := t0.Add(90*time.Minute + 500*time.Millisecond)
	res, err := f.svc.RateUsage(f.ctx, rec.ID, at, "alloc-1:seq-1")
	if err != nil {
		t.Fatal(err)
	}
	// 5401 s (rounded up) × 8 GPUs × 0.000694444444 = 30.0055555... → 3001 cents.
	if res.Amount != 3001 || res.Lines != 1 || res.Replayed {
		t.Fatalf("first rating %+v", res)
	}
	again, err := f.svc.RateUsage(f.ctx, rec.ID, at, "alloc-1:seq-1")
	if err != nil || !again.Replayed || again.Amount != 0 {
		t.Fatalf("replay %+v %v", again, err)
	}
	_, err = f.svc.RateUsage(f.ctx, rec.ID, at.Add(time.Minute), "alloc-1:seq-1")
	wantCode(t, err, apierr.InvalidRequest, "rating_key_conflict")
	if n := len(f.lines(rec.ID)); n != 1 {
		t.Fatalf("%d lines after replay and conflict", n)
	}
	if got := f.wallet(tenant, "USD"); got != 100_000-3001 {
		t.Fatalf("wallet %d", got)
	}
	// Incremental: the next rating books only the difference; stopping books the rest.
	if _, err := f.svc.RateUsage(f.ctx, rec.ID, t0.Add(2*time.Hour), "alloc-1:seq-2"); err != nil {
		t.Fatal(err)
	}
	end := t0.Add(3*time.Hour + 1*time.Millisecond)
	stop, err := f.svc.StopUsage(f.ctx, nil, SourceAllocation, rec.SourceID, end)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, l := range f.lines(rec.ID) {
		total += l.AmountMinor
		if l.LedgerEntryID.Valid == (l.AmountMinor == 0) {
			t.Fatalf("line %+v: ledger entry iff amount", l)
		}
	}
	want := oracle(h100USD, RunUnits(end.Sub(t0).Milliseconds(), 8), 2)
	if total != want || stop.RatingKey != rec.ID.String()+":final" {
		t.Fatalf("total %d, one-shot oracle %d (%+v)", total, want, stop)
	}
	if got := f.wallet(tenant, "USD"); got != 100_000-want {
		t.Fatalf("wallet %d", got)
	}
	sp, err := f.svc.Spent(f.ctx, tenant, &project, "USD", t0, t0.Add(24*time.Hour))
	if err != nil || sp != want {
		t.Fatalf("Spent %d %v", sp, err)
	}
	sp, err = f.svc.Spent(f.ctx, tenant, nil, "EUR", t0, t0.Add(24*time.Hour))
	if err != nil || sp != 0 {
		t.Fatalf("EUR spent %d %v", sp, err)
	}
	f.checkInvariants()
}

func TestRatingSplitsAtMonthAndPriceVersion(t *testing.T) {
	f := newFixture(t)
	f.clock.Set(time.Date(2026, 3, 31, 22, 0, 0, 0, time.UTC))
	eff := f.clock.Now().Add(-time.Hour)
	plan, err := f.svc.CreatePlan(f.ctx, "p", true, &eff, []PriceInput{{Unit: "gpu.h100", Currency: "USD", UnitPrice: "0.001"}})
	if err != nil {
		t.Fatal(err)
	}
	v2 := time.Date(2026, 4, 1, 1, 0, 0, 0, time.UTC)
	if _, err := f.svc.NewPlanVersion(f.ctx, plan.ID, &v2, []PriceInput{{Unit: "gpu.h100", Currency: "USD", UnitPrice: "0.002"}}); err != nil {
		t.Fatal(err)
	}
	past := f.clock.Now().Add(-time.Minute)
	_, err = f.svc.NewPlanVersion(f.ctx, plan.ID, &past, []PriceInput{{Unit: "gpu.h100", Currency: "USD", UnitPrice: "0.003"}})
	wantCode(t, err, apierr.ValidationError, "in_past")
	tenant, project := f.tenant("USD")
	f.topUp(tenant, "USD", 1_000_000)
	rec := f.start(tenant, project, 1, f.clock.Now())
	res, err := f.svc.StopUsage(f.ctx, nil, SourceAllocation, rec.SourceID, f.clock.Now().Add(4*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ls := f.lines(rec.ID)
	if len(ls) != 3 {
		t.Fatalf("%d lines: %+v", len(ls), ls)
	}
	// 2h at 0.001 (March), 1h at 0.001 (April, version 1), 1h at 0.002 (version 2).
	wantAmounts := []int64{720, 360, 720}
	wantVersions := []string{"1", "1", "2"}
	for i, l := range ls {
		if l.AmountMinor != wantAmounts[i] || *l.PricingPlanVersion != wantVersions[i] {
			t.Fatalf("line %d: %d v%s", i, l.AmountMinor, *l.PricingPlanVersion)
		}
	}
	if res.Amount != 1800 {
		t.Fatalf("total %d", res.Amount)
	}
	var snap map[string]any
	if err := f.pool.QueryRow(f.ctx, `SELECT pricing_snapshot FROM billing_rated_usage_lines WHERE id = $1`, ls[2].ID).Scan(&snap); err != nil {
		t.Fatal(err)
	}
	if snap["unit_price"] != "0.002" || snap["amount_exact"] != "7.200" {
		b, _ := json.Marshal(snap)
		t.Fatalf("snapshot %s", b)
	}
	f.checkInvariants()
}

func TestRateRunningCoversWalletThenReceivable(t *testing.T) {
	f := newFixture(t)
	f.defaultPlan()
	tenant, project := f.tenant("USD")
	f.topUp(tenant, "USD", 1000) // $10: about 1.8 hours of 8 GPUs
	f.start(tenant, project, 8, t0)
	_, err := f.svc.StartUsage(f.ctx, nil, UsageStart{Source: SourceAllocation, SourceID: uuid.New(), TenantID: tenant, UserID: uuid.New(),
		Unit: "gpu.unknown", Quantity: 1, StartedAt: t0})
	wantCode(t, err, apierr.ValidationError, "no_price")
	f.clock.Set(t0.Add(time.Hour))
	st, err := f.svc.RateRunning(f.ctx, f.clock.Now(), 100)
	if err != nil || st.Records != 1 || st.Amount != 2000 {
		t.Fatalf("first pass %+v %v", st, err)
	}
	if f.wallet(tenant, "USD") != 0 {
		t.Fatalf("wallet %d", f.wallet(tenant, "USD"))
	}
	var recv int64
	if err := f.pool.QueryRow(f.ctx, `SELECT balance_minor FROM billing_ledger_accounts WHERE tenant_id = $1 AND kind = 'tenant_receivable'`, tenant).Scan(&recv); err != nil {
		t.Fatal(err)
	}
	if recv != -1000 {
		t.Fatalf("receivable %d", recv)
	}
	// The same pass again rates nothing new.
	st, err = f.svc.RateRunning(f.ctx, f.clock.Now(), 100)
	if err != nil || st.Amount != 0 {
		t.Fatalf("second pass %+v %v", st, err)
	}
	f.checkInvariants()
}

func TestShadowRatingWritesNothing(t *testing.T) {
	f := newFixture(t)
	f.defaultPlan(PriceInput{Unit: "gpu.h100", Currency: "USD", UnitPrice: "0.02"}, PriceInput{Unit: "gpu.a100", Currency: "USD", UnitPrice: "0.0137"})
	tenant, project := f.tenant("USD")
	f.topUp(tenant, "USD", 10_000_000)
	var ids []uuid.UUID
	for i := range 3 {
		rec := f.start(tenant, project, int64(i+1), t0)
		if _, err := f.svc.RateUsage(f.ctx, rec.ID, t0.Add(time.Duration(i+1)*17*time.Minute+time.Duration(i)*time.Millisecond), "k"+rec.ID.String()); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, rec.ID)
	}
	counts := func() string {
		t.Helper()
		var s string
		// A NULL anywhere would make the whole string NULL and the scan fail: the sum is
		// coalesced, and a failed scan fails the test rather than compare "" with "".
		if err := f.pool.QueryRow(f.ctx, `SELECT (SELECT count(*) FROM billing_ledger_entries) || '/' || (SELECT count(*) FROM billing_ledger_transactions)
			|| '/' || (SELECT count(*) FROM billing_rated_usage_lines) || '/' || (SELECT count(*) FROM billing_rating_events)
			|| '/' || (SELECT count(*) FROM audit_events) || '/' || (SELECT count(*) FROM outbox_events)
			|| '/' || (SELECT coalesce(sum(rated_quantity_millis), 0) FROM billing_usage_records)`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := counts()
	lines, err := f.svc.ShadowRate(f.ctx, tenant, ids, Money{AmountMinor: 2, Currency: "USD"})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lines {
		if l.Delta != 0 || l.Existing == 0 || l.Existing != l.Candidate {
			t.Fatalf("candidate == price: %+v", l)
		}
	}
	lines, err = f.svc.ShadowRate(f.ctx, tenant, ids, Money{AmountMinor: 3, Currency: "USD"})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lines {
		if l.Delta != l.Units || l.Candidate != 3*l.Units {
			t.Fatalf("candidate 3: %+v", l)
		}
	}
	if after := counts(); after != before {
		t.Fatalf("shadow rating wrote: %s -> %s", before, after)
	}
	many := make([]uuid.UUID, 101)
	for i := range many {
		many[i] = uuid.New()
	}
	_, err = f.svc.ShadowRate(f.ctx, tenant, many, Money{AmountMinor: 1, Currency: "USD"})
	wantCode(t, err, apierr.ValidationError, "count")
	_, err = f.svc.ShadowRate(f.ctx, tenant, nil, Money{AmountMinor: 1, Currency: "USD"})
	wantCode(t, err, apierr.ValidationError, "count")
	_, err = f.svc.ShadowRate(f.ctx, tenant, many[:100], Money{AmountMinor: 1, Currency: "USD"})
	wantCode(t, err, apierr.InvalidRequest, "not_found") // 100 is allowed; these ids do not exist
	_, err = f.svc.ShadowRate(f.ctx, tenant, ids, Money{AmountMinor: 1, Currency: "EUR"})
	wantCode(t, err, apierr.ValidationError, "currency_mismatch")
	other, _ := f.tenant("USD")
	_, err = f.svc.ShadowRate(f.ctx, other, ids, Money{AmountMinor: 1, Currency: "USD"})
	wantCode(t, err, apierr.InvalidRequest, "not_found")
}

func TestRunwayLaunchWatcherAndTopUp(t *testing.T) {
	f := newFixture(t)
	f.defaultPlan(PriceInput{Unit: "gpu.h100", Currency: "USD", UnitPrice: "0.001"}) // $3.60 per GPU-hour
	tenant, project := f.tenant("USD")
	f.topUp(tenant, "USD", 720) // $7.20: one GPU for 2 h
	d, err := f.svc.CanLaunch(f.ctx, tenant, project, "gpu.h100", 2, "")
	if err != nil || !d.Allowed || d.Required != 720 {
		t.Fatalf("2 GPUs for 1h: %+v %v", d, err)
	}
	// The decision carries the price the launch is billed at: the plan's version in force.
	if d.UnitPrice != "0.001" || d.PlanVersion != 1 || d.PlanID == uuid.Nil {
		t.Fatalf("price in force: %+v", d)
	}
	d, _ = f.svc.CanLaunch(f.ctx, tenant, project, "gpu.h100", 3, "USD")
	if d.Allowed || d.Required != 1080 {
		t.Fatalf("3 GPUs: %+v", d)
	}
	wantCode(t, d.Err(), apierr.InsufficientBalance, "")
	_, err = f.svc.CanLaunch(f.ctx, tenant, project, "gpu.b200", 1, "")
	wantCode(t, err, apierr.ValidationError, "no_price")

	f.start(tenant, project, 1, t0)
	// After 100 minutes, 20 minutes of runway are left; pending usage counts.
	f.clock.Set(t0.Add(100 * time.Minute))
	d, _ = f.svc.CanLaunch(f.ctx, tenant, project, "gpu.h100", 1, "")
	if d.Allowed || d.Pending != 600 || d.Available != 120 {
		t.Fatalf("with a run: %+v", d)
	}
	blocked, _, err := f.svc.WatchRunway(f.ctx)
	if err != nil || blocked != 0 {
		t.Fatalf("20 min left: blocked %d %v", blocked, err)
	}
	f.clock.Set(t0.Add(111 * time.Minute))
	blocked, _, err = f.svc.WatchRunway(f.ctx)
	if err != nil || blocked != 1 {
		t.Fatalf("9 min left: blocked %d %v", blocked, err)
	}
	blocked, _, _ = f.svc.WatchRunway(f.ctx)
	if blocked != 0 {
		t.Fatal("blocked twice")
	}
	var payload map[string]any
	if err := f.pool.QueryRow(f.ctx, `SELECT payload FROM outbox_events WHERE event_type = $1`, EventRunwayExhausted).Scan(&payload); err != nil {
		t.Fatal(err)
	}
	if payload["tenant_id"] != tenant.String() || payload["action"] != "stop_running_workloads" || len(payload["runs"].([]any)) != 1 {
		t.Fatalf("payload %v", payload)
	}
	// A small top-up does not lift the block; one covering the minimum runway does, at once.
	f.topUp(tenant, "USD", 100)
	if _, err := billingdb.New(f.pool).GetRunwayBlock(f.ctx, billingdb.GetRunwayBlockParams{TenantID: tenant, Currency: "USD"}); err != nil {
		t.Fatalf("block lifted early: %v", err)
	}
	f.topUp(tenant, "USD", 500)
	var restored int
	if err := f.pool.QueryRow(f.ctx, `SELECT count(*) FROM outbox_events WHERE event_type = $1`, EventRunwayRestored).Scan(&restored); err != nil {
		t.Fatal(err)
	}
	if restored != 1 {
		t.Fatalf("%d restored events", restored)
	}
	f.checkInvariants()
}
