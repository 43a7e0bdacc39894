package billing

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

// endCustomer makes customer an end customer of reseller (billing accounts written as
// the accounts package writes them), rated wholesale at plan, with the given risk owner.
func (f *fixture) endCustomer(reseller, customer, plan uuid.UUID, owner string) {
	f.t.Helper()
	rid := uuid.New()
	if _, err := f.pool.Exec(f.ctx, `INSERT INTO billing_accounts (id, tenant_id, account_type, created_at, updated_at)
		VALUES ($1, $2, 'reseller', now(), now())`, rid, reseller); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.pool.Exec(f.ctx, `INSERT INTO billing_accounts (id, tenant_id, account_type, parent_billing_account_id,
			reseller_tenant_id, wholesale_pricing_plan_id, credit_risk_owner, tax_responsibility, created_at, updated_at)
		VALUES ($1, $2, 'end_customer', $3, $4, $5, $6, 'reseller', now(), now())`, uuid.New(), customer, rid, reseller, nullUUID(plan), owner); err != nil {
		f.t.Fatal(err)
	}
}

type ratedRow struct {
	tenant   uuid.UUID
	role     string
	amount   int64
	entry    uuid.NullUUID
	project  uuid.NullUUID
	user     uuid.UUID
	key      string
	planName string
}

func (f *fixture) rated(record uuid.UUID) []ratedRow {
	f.t.Helper()
	rows, err := f.pool.Query(f.ctx, `SELECT tenant_id, rating_role, amount_minor, ledger_entry_id, project_id, requested_by_user_id,
		rating_key, pricing_snapshot->>'plan_name' FROM billing_rated_usage_lines WHERE usage_record_id = $1 ORDER BY rating_role, bill_from`, record)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	var out []ratedRow
	for rows.Next() {
		var r ratedRow
		if err := rows.Scan(&r.tenant, &r.role, &r.amount, &r.entry, &r.project, &r.user, &r.key, &r.planName); err != nil {
			f.t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// One end-customer usage gives exactly two rated lines: the customer-priced one on the
// end customer's tenant and the wholesale one on the reseller's, each once by its
// rating key; only the credit risk owner's wallet is debited; neither side sees the
// other's lines, and the reseller's line names none of the end customer's projects or
// users.
func TestResellerRatingTwoLinesRightWallet(t *testing.T) {
	f := newFixture(t)
	f.defaultPlan() // customer prices: 0.000694444444 USD per GPU-second (2.50 an hour)
	eff := t0.Add(-24 * time.Hour)
	wholesale, err := f.svc.CreatePlan(f.ctx, "wholesale", false, &eff, []PriceInput{{Unit: "gpu.h100", Currency: "USD", UnitPrice: "0.0005"}})
	if err != nil {
		t.Fatal(err)
	}
	reseller, _ := f.tenant("USD")
	customer, project := f.tenant("USD")
	f.endCustomer(reseller, customer, wholesale.ID, RiskReseller)
	f.topUp(reseller, "USD", 10000)
	f.topUp(customer, "USD", 10000)

	rec := f.start(customer, project, 1, t0)
	f.clock.Set(t0.Add(time.Hour))
	res, err := f.svc.RateUsage(f.ctx, rec.ID, t0.Add(time.Hour), "k1")
	if err != nil {
		t.Fatal(err)
	}
	if res.Amount != 250 || res.Wholesale != 180 || res.Lines != 1 || res.WholesaleLines != 1 {
		t.Fatalf("result %+v", res)
	}
	lines := f.rated(rec.ID)
	if len(lines) != 2 {
		t.Fatalf("%d rated lines", len(lines))
	}
	cust, ws := lines[0], lines[1]
	if cust.role != "customer" || cust.tenant != customer || cust.amount != 250 || cust.entry.Valid || cust.key != "k1/0" || cust.planName != "standard" {
		t.Fatalf("customer line %+v", cust)
	}
	if ws.role != "wholesale" || ws.tenant != reseller || ws.amount != 180 || !ws.entry.Valid || ws.key != "k1/wholesale/0" ||
		ws.project.Valid || ws.user != uuid.Nil || ws.planName != "wholesale" {
		t.Fatalf("wholesale line %+v", ws)
	}
	if f.wallet(reseller, "USD") != 10000-180 || f.wallet(customer, "USD") != 10000 {
		t.Fatalf("wallets: reseller %d customer %d", f.wallet(reseller, "USD"), f.wallet(customer, "USD"))
	}
	// The same key again is a replay: no third line, no second debit.
	res, err = f.svc.RateUsage(f.ctx, rec.ID, t0.Add(time.Hour), "k1")
	if err != nil || !res.Replayed || len(f.rated(rec.ID)) != 2 || f.wallet(reseller, "USD") != 10000-180 {
		t.Fatalf("replay %+v %v", res, err)
	}
	// Continuing the run continues both ratings: increments sum to the one-shot amounts.
	if _, err := f.svc.StopUsage(f.ctx, nil, SourceAllocation, rec.SourceID, t0.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	var custSum, wsSum int64
	for _, l := range f.rated(rec.ID) {
		if l.role == "wholesale" {
			wsSum += l.amount
		} else {
			custSum += l.amount
		}
	}
	if custSum != 500 || wsSum != 360 || f.wallet(reseller, "USD") != 10000-360 {
		t.Fatalf("two hours: customer %d wholesale %d reseller wallet %d", custSum, wsSum, f.wallet(reseller, "USD"))
	}

	// No cross-visibility: each tenant lists only its own side.
	far := t0.Add(48 * time.Hour)
	mine, err := f.svc.ListUsage(f.ctx, customer, t0.Add(-time.Hour), far, "start_time_desc", nil, 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range mine {
		if l.PricingSource == "wholesale_plan" || l.TenantID != customer {
			t.Fatalf("the end customer sees a wholesale line: %+v", l)
		}
	}
	theirs, err := f.svc.ListUsage(f.ctx, reseller, t0.Add(-time.Hour), far, "start_time_desc", nil, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(mine) != 2 || len(theirs) != 2 {
		t.Fatalf("customer sees %d, reseller %d lines", len(mine), len(theirs))
	}
	for _, l := range theirs {
		if l.PricingSource != "wholesale_plan" || l.ProjectID.Valid || l.RequestedByUserID != uuid.Nil {
			t.Fatalf("the reseller sees the end customer's usage as its own: %+v", l)
		}
	}

	// Platform credit risk: the end customer's wallet pays the customer price; the
	// wholesale line is the reseller's statement without a ledger entry.
	if _, err := f.pool.Exec(f.ctx, `UPDATE billing_accounts SET credit_risk_owner = 'platform' WHERE tenant_id = $1`, customer); err != nil {
		t.Fatal(err)
	}
	rec2 := f.start(customer, project, 1, t0.Add(3*time.Hour))
	if _, err := f.svc.StopUsage(f.ctx, nil, SourceAllocation, rec2.SourceID, t0.Add(4*time.Hour)); err != nil {
		t.Fatal(err)
	}
	lines = f.rated(rec2.ID)
	if len(lines) != 2 || !lines[0].entry.Valid || lines[1].entry.Valid || lines[1].tenant != reseller {
		t.Fatalf("platform risk lines %+v", lines)
	}
	if f.wallet(customer, "USD") != 10000-250 || f.wallet(reseller, "USD") != 10000-360 {
		t.Fatalf("platform risk wallets: customer %d reseller %d", f.wallet(customer, "USD"), f.wallet(reseller, "USD"))
	}
	f.checkInvariants()
}

// An end customer whose reseller carries the credit risk launches on the reseller's
// wallet: an empty end-customer wallet does not stop it, the reseller's arrears do.
func TestResellerRiskLaunchesOnResellerWallet(t *testing.T) {
	f := newFixture(t)
	f.defaultPlan()
	reseller, rproject := f.tenant("USD")
	customer, project := f.tenant("USD")
	f.endCustomer(reseller, customer, uuid.Nil, RiskReseller)
	d, err := f.svc.CanLaunch(f.ctx, customer, project, "gpu.h100", 1, "")
	if err != nil || d.Allowed {
		t.Fatalf("unfunded reseller: %+v %v", d, err)
	}
	f.topUp(reseller, "USD", 10000)
	d, err = f.svc.CanLaunch(f.ctx, customer, project, "gpu.h100", 1, "")
	if err != nil || !d.Allowed || d.Balance != 10000 {
		t.Fatalf("funded reseller: %+v %v", d, err)
	}
	// The runway watcher never blocks the end customer for its own (unused) empty wallet.
	run := f.start(customer, project, 8, t0)
	f.clock.Set(t0.Add(time.Minute))
	if blocked, _, err := f.svc.WatchRunway(f.ctx); err != nil || blocked != 0 {
		t.Fatalf("watcher blocked %d: %v", blocked, err)
	}
	if _, err := f.svc.StopUsage(f.ctx, nil, SourceAllocation, run.SourceID, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if f.wallet(reseller, "USD") != 10000-33 || f.wallet(customer, "USD") != 0 {
		t.Fatalf("the minute of 8 GPUs: reseller %d customer %d", f.wallet(reseller, "USD"), f.wallet(customer, "USD"))
	}
	// The reseller runs up arrears on its own usage: its end customer is refused too.
	rec := f.start(reseller, rproject, 8, t0)
	if _, err := f.svc.StopUsage(f.ctx, nil, SourceAllocation, rec.SourceID, t0.Add(6*time.Hour)); err != nil {
		t.Fatal(err)
	}
	d, err = f.svc.CanLaunch(f.ctx, customer, project, "gpu.h100", 1, "")
	if err != nil || d.Allowed || d.Arrears != 12000-(10000-33) {
		t.Fatalf("reseller in arrears: %+v %v", d, err)
	}
	wantCode(t, d.Err(), apierr.InsufficientBalance, "arrears")
}
