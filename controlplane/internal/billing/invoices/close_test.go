package invoices_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing/invoices"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/google/uuid"
)

func TestCloseBuildsDraftOnceAndRefusesOverlaps(t *testing.T) {
	f := newFixture(t)
	tenant, proj := f.tenant()
	f.topUp(tenant, "USD", 10000)
	// 2 GPUs for one hour: 7200 GPU-seconds = 7200 minor units, all paid by the wallet.
	f.usage(tenant, proj, "USD", 2, midMarch, midMarch.Add(time.Hour))
	// EUR usage never lands on the USD invoice (nor its money).
	f.usage(tenant, proj, "EUR", 1, midMarch, midMarch.Add(10*time.Second))

	// The period has not ended.
	_, err := f.svc.Close(f.ctx, invoices.Period{TenantID: tenant, Currency: "USD", Start: march, End: april})
	wantErr(t, err, apierr.ValidationError, 422, "period_open")
	_, err = f.svc.Close(f.ctx, invoices.Period{TenantID: tenant, Currency: "XXX", Start: march, End: march.Add(time.Hour)})
	wantErr(t, err, apierr.ValidationError, 422, "unsupported_currency")
	_, err = f.svc.Close(f.ctx, invoices.Period{TenantID: tenant, Currency: "USD", Start: march, End: march})
	wantErr(t, err, apierr.ValidationError, 422, "empty_period")
	if n := f.count(`SELECT count(*) FROM billing_invoices`); n != 0 {
		t.Fatalf("%d invoices after refusals", n)
	}

	f.clk.Set(april.Add(time.Hour))
	c := f.close(tenant, "USD", march, april)
	if !c.Created || c.Invoice.Status != invoices.StatusDraft || c.Invoice.Number != nil {
		t.Fatalf("close: %+v", c)
	}
	inv := f.get(c.Invoice.ID)
	usage := linesOf(inv, invoices.LineRatedUsage)
	if len(usage) != 1 || usage[0].Amount != 7200 || !usage[0].RatedUsageLineID.Valid || usage[0].Currency != "USD" {
		t.Fatalf("usage lines %+v", usage)
	}
	pay := linesOf(inv, invoices.LinePayment)
	if len(pay) != 1 || pay[0].Amount != 10000 || !pay[0].PaymentSessionID.Valid {
		t.Fatalf("payment lines %+v", pay)
	}
	if tx := linesOf(inv, invoices.LineTax); len(tx) != 0 {
		t.Fatalf("not_configured has tax lines %+v", tx)
	}
	want := invoices.Totals{Subtotal: 7200, Tax: 0, Credits: 0, Received: 10000, Prepaid: 7200, Total: 7200}
	if inv.Totals != want || inv.AmountDue() != 0 {
		t.Fatalf("totals %+v (due %d), want %+v", inv.Totals, inv.AmountDue(), want)
	}
	if inv.TaxTreatment != invoices.TreatmentNotConfigured || inv.TaxSnapshot["treatment"] != "not_configured" {
		t.Fatalf("tax %s %v", inv.TaxTreatment, inv.TaxSnapshot)
	}

	// Closing the same period again: the same invoice, nothing more written.
	lines := f.count(`SELECT count(*) FROM billing_invoice_lines`)
	again := f.close(tenant, "USD", march, april)
	if again.Created || again.Invoice.ID != inv.ID {
		t.Fatalf("second close: %+v", again)
	}
	if n := f.count(`SELECT count(*) FROM billing_invoice_lines`); n != lines {
		t.Fatalf("lines %d → %d on a re-run", lines, n)
	}
	if n := f.count(`SELECT count(*) FROM audit_events WHERE action = 'billing.invoice.close'`); n != 1 {
		t.Fatalf("%d close audits", n)
	}
	// An overlapping period is refused.
	f.clk.Set(may)
	_, err = f.svc.Close(f.ctx, invoices.Period{TenantID: tenant, Currency: "USD", Start: march.AddDate(0, 0, 14), End: april.AddDate(0, 0, 5)})
	e := wantErr(t, err, apierr.InvalidRequest, 409, "invoice_period_overlap")
	if e.Details["invoice_id"] != inv.ID.String() {
		t.Fatalf("overlap names %v", e.Details)
	}
	_, err = f.svc.Close(f.ctx, invoices.Period{TenantID: tenant, Currency: "USD", Start: march, End: april.Add(-time.Hour)})
	wantErr(t, err, apierr.InvalidRequest, 409, "invoice_period_overlap")
	// The EUR period is its own invoice.
	eur := f.close(tenant, "EUR", march, april)
	if eur.Invoice.ID == inv.ID || eur.Invoice.Totals.Subtotal != 20 {
		t.Fatalf("EUR invoice %+v", eur.Invoice.Totals)
	}
	if n := f.count(`SELECT count(*) FROM billing_invoice_lines WHERE invoice_id = $1 AND currency <> 'USD'`, inv.ID); n != 0 {
		t.Fatalf("%d foreign-currency lines on the USD invoice", n)
	}
}

// Usage rated after its period closed goes on the next invoice as a correction, never
// into the closed one.
func TestLateUsageIsACorrectionOnTheNextInvoice(t *testing.T) {
	f := newFixture(t)
	tenant, proj := f.tenant()
	f.topUp(tenant, "USD", 100000)
	f.usage(tenant, proj, "USD", 1, midMarch, midMarch.Add(100*time.Second))
	f.clk.Set(april.Add(time.Hour))
	mar := f.close(tenant, "USD", march, april).Invoice
	if _, err := f.svc.Issue(f.ctx, mar.ID); err != nil {
		t.Fatal(err)
	}
	// A March run reported late, rated in April.
	f.usage(tenant, proj, "USD", 1, midMarch.Add(time.Hour), midMarch.Add(time.Hour+50*time.Second))
	f.usage(tenant, proj, "USD", 1, april.AddDate(0, 0, 2), april.AddDate(0, 0, 2).Add(30*time.Second))
	f.clk.Set(may.Add(time.Hour))
	apr := f.get(f.close(tenant, "USD", april, may).Invoice.ID)
	if got := f.get(mar.ID); got.Totals.Subtotal != 100 || len(linesOf(got, invoices.LineRatedUsage)) != 1 {
		t.Fatalf("the issued March invoice changed: %+v", got.Totals)
	}
	usage := linesOf(apr, invoices.LineRatedUsage)
	if len(usage) != 2 || apr.Totals.Subtotal != 80 {
		t.Fatalf("April: %d usage lines, subtotal %d", len(usage), apr.Totals.Subtotal)
	}
	if usage[0].Amount != 50 || usage[0].Description[:11] != "Correction," || apr.TaxSnapshot["corrections"] != float64(1) {
		t.Fatalf("correction line %+v", usage[0])
	}
}

func standard(bps int) invoices.TaxProfile {
	return invoices.TaxProfile{Treatment: invoices.TreatmentStandard, DefaultRateBps: &bps, Jurisdiction: ptr("DE"),
		SellerRegistration: ptr("DE999999999")}
}

func TestCloseStandardTaxReferencesSubjects(t *testing.T) {
	f := newFixture(t)
	f.tax = standard(1900)
	tenant, proj := f.tenant()
	f.topUp(tenant, "USD", 1000)
	// Two runs of 5 and 10 seconds, and an admin debit of 7: 22 minor units at 19% = 4.18 → 4.
	f.usage(tenant, proj, "USD", 1, midMarch, midMarch.Add(5*time.Second))
	f.usage(tenant, proj, "USD", 1, midMarch.Add(time.Minute), midMarch.Add(time.Minute+10*time.Second))
	if _, err := f.billing.Adjust(f.ctx, billing.Adjustment{TenantID: tenant, Money: billing.Money{AmountMinor: -7, Currency: "USD"}, Reason: "Support fee"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.billing.Adjust(f.ctx, billing.Adjustment{TenantID: tenant, Money: billing.Money{AmountMinor: 500, Currency: "USD"}, Reason: "Goodwill"}); err != nil {
		t.Fatal(err)
	}
	f.clk.Set(april.Add(time.Hour))
	inv := f.get(f.close(tenant, "USD", march, april).Invoice.ID)
	taxes := linesOf(inv, invoices.LineTax)
	// compute (15 at 19% = 2.85 → 3) and adjustment (7 at 19% = 1.33 → 1): one line each.
	if len(taxes) != 2 {
		t.Fatalf("tax lines %+v", taxes)
	}
	byCat := map[string]invoices.Line{}
	for _, l := range taxes {
		byCat[*l.TaxCategory] = l
	}
	if byCat["compute"].Amount != 3 || byCat["adjustment"].Amount != 1 || *byCat["compute"].TaxRateBps != 1900 {
		t.Fatalf("tax lines %+v", byCat)
	}
	subjects := byCat["compute"].TaxEvidence["subject_line_ids"].([]any)
	usage := linesOf(inv, invoices.LineRatedUsage)
	if len(subjects) != 2 || subjects[0] != usage[0].ID.String() || subjects[1] != usage[1].ID.String() ||
		byCat["compute"].TaxSubjectLineID.UUID != usage[0].ID {
		t.Fatalf("subjects %v, usage %v %v", subjects, usage[0].ID, usage[1].ID)
	}
	if inv.Totals != (invoices.Totals{Subtotal: 22, Tax: 4, Credits: 0, Received: 1500, Prepaid: 22, Total: 26}) || inv.AmountDue() != 4 {
		t.Fatalf("totals %+v", inv.Totals)
	}
	if *inv.TaxJurisdiction != "DE" || *inv.SellerTaxRegistration != "DE999999999" {
		t.Fatalf("tax fields %v %v", inv.TaxJurisdiction, inv.SellerTaxRegistration)
	}
	if len(linesOf(inv, invoices.LinePayment)) != 2 { // the top-up and the goodwill credit
		t.Fatalf("payment lines %+v", linesOf(inv, invoices.LinePayment))
	}
}

func TestCloseReverseChargeAndExempt(t *testing.T) {
	f := newFixture(t)
	tenant, proj := f.tenant()
	f.usage(tenant, proj, "USD", 1, midMarch, midMarch.Add(100*time.Second))
	f.clk.Set(april.Add(time.Hour))

	// Without the customer's registration: refused, nothing written.
	f.tax = invoices.TaxProfile{Treatment: invoices.TreatmentReverseCharge, Evidence: map[string]any{"vies": "valid"}}
	_, err := f.svc.Close(f.ctx, invoices.Period{TenantID: tenant, Currency: "USD", Start: march, End: april})
	wantErr(t, err, apierr.ValidationError, 422, "reverse_charge_requires_registration")
	f.tax = invoices.TaxProfile{Treatment: invoices.TreatmentTaxExempt, ExemptReason: ptr("charity")}
	_, err = f.svc.Close(f.ctx, invoices.Period{TenantID: tenant, Currency: "USD", Start: march, End: april})
	wantErr(t, err, apierr.ValidationError, 422, "tax_exempt_requires_evidence")
	f.tax = standard(10001)
	_, err = f.svc.Close(f.ctx, invoices.Period{TenantID: tenant, Currency: "USD", Start: march, End: april})
	wantErr(t, err, apierr.ValidationError, 422, "tax_rate_out_of_range")
	if n := f.count(`SELECT count(*) FROM billing_invoices`) + f.count(`SELECT count(*) FROM billing_invoice_lines`); n != 0 {
		t.Fatalf("%d rows after refusals", n)
	}

	f.tax = invoices.TaxProfile{Treatment: invoices.TreatmentReverseCharge, CustomerRegistration: ptr("FR12345678901"),
		Jurisdiction: ptr("EU"), Evidence: map[string]any{"vies_check": "valid", "checked_at": "2026-03-31"}}
	inv := f.get(f.close(tenant, "USD", march, april).Invoice.ID)
	if len(linesOf(inv, invoices.LineTax)) != 0 || inv.Totals.Tax != 0 || inv.Totals.Total != 100 {
		t.Fatalf("reverse charge taxed: %+v", inv.Totals)
	}
	if inv.LegalNote == nil || *inv.LegalNote != invoices.ReverseChargeNote || *inv.CustomerTaxRegistration != "FR12345678901" {
		t.Fatalf("legal note %v", inv.LegalNote)
	}
	u := linesOf(inv, invoices.LineRatedUsage)[0]
	if u.ReverseChargeReason == nil || *u.TaxRateBps != 0 || u.TaxEvidence["vies_check"] != "valid" {
		t.Fatalf("line tax fields %+v", u)
	}

	other, proj2 := f.tenant()
	f.clk.Set(midMarch)
	f.usage(other, proj2, "USD", 1, midMarch, midMarch.Add(100*time.Second))
	f.clk.Set(april.Add(time.Hour))
	f.tax = invoices.TaxProfile{Treatment: invoices.TreatmentTaxExempt, ExemptReason: ptr("registered charity"), Evidence: map[string]any{"certificate": "CH-1"}}
	ex := f.get(f.close(other, "USD", march, april).Invoice.ID)
	if len(linesOf(ex, invoices.LineTax)) != 0 || *linesOf(ex, invoices.LineRatedUsage)[0].TaxExemptReason != "registered charity" {
		t.Fatalf("exempt invoice %+v", ex)
	}
	_ = uuid.Nil
}

// Usage the wallet could not cover is due on the invoice; money that later settles the
// arrears (a receivable credit) is shown as received on the next invoice and pays the
// open one.
func TestArrearsAreDueAndSettledByTheNextClose(t *testing.T) {
	f := newFixture(t)
	tenant, proj := f.tenant()
	f.topUp(tenant, "USD", 30)
	f.usage(tenant, proj, "USD", 1, midMarch, midMarch.Add(100*time.Second)) // 100: 30 from the wallet, 70 owed
	f.clk.Set(april.Add(time.Hour))
	mar := f.close(tenant, "USD", march, april).Invoice
	if mar.Totals.Total != 100 || mar.Totals.Prepaid != 30 {
		t.Fatalf("March %+v", mar.Totals)
	}
	inv, err := f.svc.Issue(f.ctx, mar.ID)
	if err != nil || inv.Status != invoices.StatusDue || inv.AmountDue() != 70 {
		t.Fatalf("issue: %v %s %d", err, inv.Status, inv.AmountDue())
	}
	// Money arrives in April and settles the 70 first (as billing's arrears-first credit
	// does), the rest reaching the wallet.
	err = db.InTx(f.ctx, f.pool, func(tx pgx.Tx) error {
		_, err := f.billing.Ledger.Post(f.ctx, tx, billing.Posting{Kind: billing.TxnTopUp, TenantID: tenant, Reference: "payment:" + uuid.NewString(),
			Legs: []billing.Leg{
				{Account: billing.AccountKey{Kind: billing.AccountReceivable, TenantID: tenant, Currency: "USD"}, Amount: 70},
				{Account: billing.AccountKey{Kind: billing.AccountWallet, TenantID: tenant, Currency: "USD"}, Amount: 30},
				{Account: billing.AccountKey{Kind: billing.AccountPaymentClearing, Currency: "USD"}, Amount: -100},
			}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	f.clk.Set(may.Add(time.Hour))
	apr := f.get(f.close(tenant, "USD", april, may).Invoice.ID)
	pay := linesOf(apr, invoices.LinePayment)
	if len(pay) != 1 || pay[0].Amount != 100 || !strings.Contains(pay[0].Description, "0.70 USD settled arrears") {
		t.Fatalf("April payment lines %+v", pay)
	}
	if got := f.get(mar.ID); got.Status != invoices.StatusPaid || got.Paid != 70 {
		t.Fatalf("March after settlement: %s paid %d", got.Status, got.Paid)
	}
	// Closing April again applies nothing twice.
	f.close(tenant, "USD", april, may)
	if n := f.count(`SELECT count(*) FROM billing_invoice_payments`); n != 1 {
		t.Fatalf("%d invoice payments", n)
	}
}

// A write-off takes what the tenant still owed off its receivable (as a loss), and a void
// undoes the charge on the receivable too: in neither case does money that arrives later
// settle the forgiven debt first, and no later close reads the posting as a payment.
func TestWriteOffAndVoidClearTheReceivable(t *testing.T) {
	f := newFixture(t)
	arrears := func(tenant uuid.UUID) int64 {
		t.Helper()
		owed, err := f.billing.Ledger.Arrears(f.ctx, f.pool, tenant, "USD")
		if err != nil {
			t.Fatal(err)
		}
		return owed
	}
	issuedWithArrears := func() (uuid.UUID, invoices.Invoice) {
		t.Helper()
		tenant, proj := f.tenant()
		f.topUp(tenant, "USD", 30)
		f.usage(tenant, proj, "USD", 1, midMarch, midMarch.Add(100*time.Second)) // 30 from the wallet, 70 owed
		f.clk.Set(april.Add(time.Hour))
		mar := f.close(tenant, "USD", march, april).Invoice
		inv, err := f.svc.Issue(f.ctx, mar.ID)
		if err != nil || inv.AmountDue() != 70 || arrears(tenant) != 70 {
			t.Fatalf("issue: %v due %d owed %d", err, inv.AmountDue(), arrears(tenant))
		}
		return tenant, inv
	}

	tenant, inv := issuedWithArrears()
	if _, err := f.svc.WriteOff(f.ctx, inv.ID, "uncollectable"); err != nil {
		t.Fatal(err)
	}
	if owed := arrears(tenant); owed != 0 {
		t.Fatalf("after the write-off the tenant still owes %d", owed)
	}
	// Money arriving now all reaches the wallet: nothing is left to settle.
	f.topUp(tenant, "USD", 50)
	if owed := arrears(tenant); owed != 0 {
		t.Fatalf("owed %d after a top-up", owed)
	}
	f.clk.Set(may.Add(time.Hour))
	apr := f.get(f.close(tenant, "USD", april, may).Invoice.ID)
	for _, l := range linesOf(apr, invoices.LinePayment) {
		if strings.Contains(l.Description, "arrears") {
			t.Fatalf("the write-off was read as money settling arrears: %+v", l)
		}
	}

	tenant2, inv2 := issuedWithArrears()
	if _, err := f.svc.Void(f.ctx, inv2.ID, "billed in error", true); err != nil {
		t.Fatal(err)
	}
	if owed := arrears(tenant2); owed != 0 {
		t.Fatalf("after the void the tenant still owes %d", owed)
	}
	if n := f.count(`SELECT count(*) FROM audit_events WHERE action IN ('billing.invoice.write_off', 'billing.invoice.void')
		AND (metadata->>'receivable_cleared_minor')::int = 70`); n != 2 {
		t.Fatalf("%d audit rows record the 70 cleared, want 2", n)
	}
}
