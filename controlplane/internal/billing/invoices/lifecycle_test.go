package invoices_test

import (
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing/invoices"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// dueInvoice is a closed March invoice of a new tenant with amount due: 100 minor units
// of usage, 19% tax (19 due), the wallet paid the 100.
func (f *fixture) dueDraft() invoices.Invoice {
	f.t.Helper()
	f.tax = standard(1900)
	f.clk.Set(midMarch)
	tenant, proj := f.tenant()
	f.topUp(tenant, "USD", 1000)
	f.usage(tenant, proj, "USD", 1, midMarch, midMarch.Add(100*time.Second))
	f.clk.Set(april.Add(time.Hour))
	return f.close(tenant, "USD", march, april).Invoice
}

func (f *fixture) history(id uuid.UUID) string {
	f.t.Helper()
	rows, err := f.pool.Query(f.ctx, `SELECT coalesce(from_status, '-'), to_status FROM billing_invoice_transitions WHERE invoice_id = $1 ORDER BY created_at, id`, id)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	out := ""
	for rows.Next() {
		var a, b string
		if err := rows.Scan(&a, &b); err != nil {
			f.t.Fatal(err)
		}
		out += a + ">" + b + " "
	}
	return out
}

func TestIssuePayAndEveryRefusedMove(t *testing.T) {
	f := newFixture(t)
	d := f.dueDraft()
	// Payments before issue are refused naming the state.
	_, err := f.svc.Pay(f.ctx, invoices.Payment{InvoiceID: d.ID, Amount: 1, Currency: "USD", Reference: "p0"})
	e := wantErr(t, err, apierr.InvalidRequest, 409, "invoice_state_invalid")
	if e.Details["status"] != "draft" {
		t.Fatalf("refusal names %v", e.Details)
	}
	_, err = f.svc.WriteOff(f.ctx, d.ID, "")
	wantErr(t, err, apierr.InvalidRequest, 409, "invoice_state_invalid")

	inv, err := f.svc.Issue(f.ctx, d.ID)
	if err != nil {
		t.Fatal(err)
	}
	if inv.Status != invoices.StatusDue || *inv.Number != "GNT-000001" || inv.AmountDue() != 19 ||
		!inv.DueAt.Equal(inv.IssuedAt.AddDate(0, 0, 14)) {
		t.Fatalf("issued: %s %v due %d", inv.Status, inv.Number, inv.AmountDue())
	}
	_, err = f.svc.Issue(f.ctx, d.ID)
	e = wantErr(t, err, apierr.InvalidRequest, 409, "invoice_state_invalid")
	if e.Details["status"] != "due" {
		t.Fatalf("second issue names %v", e.Details)
	}
	// Immutable: the database refuses changes of its lines and amounts, even by hand.
	if _, err := f.pool.Exec(f.ctx, `UPDATE billing_invoice_lines SET amount_minor = 1 WHERE invoice_id = $1`, d.ID); err == nil {
		t.Fatal("a line of an issued invoice was changed")
	}
	if _, err := f.pool.Exec(f.ctx, `UPDATE billing_invoices SET total_minor = 1, subtotal_minor = -18 WHERE id = $1`, d.ID); err == nil {
		t.Fatal("the total of an issued invoice was changed")
	}
	if _, err := f.pool.Exec(f.ctx, `DELETE FROM billing_invoice_lines WHERE invoice_id = $1`, d.ID); err == nil {
		t.Fatal("a line of an issued invoice was deleted")
	}
	if _, err := f.pool.Exec(f.ctx, `INSERT INTO billing_invoice_lines (id, invoice_id, position, line_type, description, currency, amount_minor, tax_evidence, created_at)
		VALUES (gen_random_uuid(), $1, 99, 'fee', 'late fee', 'USD', 1, '{}', now())`, d.ID); err == nil {
		t.Fatal("a line was added to an issued invoice")
	}

	// Currency mismatch and overpayment are refused; nothing is applied.
	_, err = f.svc.Pay(f.ctx, invoices.Payment{InvoiceID: d.ID, Amount: 5, Currency: "EUR", Reference: "p-eur"})
	wantErr(t, err, apierr.ValidationError, 422, "currency_mismatch")
	_, err = f.svc.Pay(f.ctx, invoices.Payment{InvoiceID: d.ID, Amount: 20, Currency: "USD", Reference: "p-over"})
	wantErr(t, err, apierr.ValidationError, 422, "overpayment")

	inv, err = f.svc.Pay(f.ctx, invoices.Payment{InvoiceID: d.ID, Amount: 9, Currency: "USD", Reference: "p1"})
	if err != nil || inv.Status != invoices.StatusPartiallyPaid || inv.AmountDue() != 10 {
		t.Fatalf("partial: %v %s %d", err, inv.Status, inv.AmountDue())
	}
	// The same reference again changes nothing; with another amount it is a conflict.
	if inv, err = f.svc.Pay(f.ctx, invoices.Payment{InvoiceID: d.ID, Amount: 9, Currency: "USD", Reference: "p1"}); err != nil || inv.Paid != 9 {
		t.Fatalf("replay: %v paid %d", err, inv.Paid)
	}
	_, err = f.svc.Pay(f.ctx, invoices.Payment{InvoiceID: d.ID, Amount: 8, Currency: "USD", Reference: "p1"})
	wantErr(t, err, apierr.InvalidRequest, 409, "reference_conflict")
	// Partially paid cannot be voided (refund first).
	_, err = f.svc.Void(f.ctx, d.ID, "", true)
	e = wantErr(t, err, apierr.InvalidRequest, 409, "invoice_state_invalid")
	if e.Details["status"] != "partially_paid" {
		t.Fatalf("void refusal names %v", e.Details)
	}
	inv, err = f.svc.Pay(f.ctx, invoices.Payment{InvoiceID: d.ID, Amount: 10, Currency: "USD", Reference: "p2"})
	if err != nil || inv.Status != invoices.StatusPaid || inv.AmountDue() != 0 || inv.PaidAt == nil {
		t.Fatalf("paid: %v %s", err, inv.Status)
	}
	// paid is final: void, write-off, pay and issue are refused naming "paid".
	for name, try := range map[string]func() error{
		"void":      func() error { _, err := f.svc.Void(f.ctx, d.ID, "", true); return err },
		"write_off": func() error { _, err := f.svc.WriteOff(f.ctx, d.ID, ""); return err },
		"issue":     func() error { _, err := f.svc.Issue(f.ctx, d.ID); return err },
		"pay": func() error {
			_, err := f.svc.Pay(f.ctx, invoices.Payment{InvoiceID: d.ID, Amount: 1, Currency: "USD", Reference: "p3"})
			return err
		},
	} {
		e := wantErr(t, try(), apierr.InvalidRequest, 409, "invoice_state_invalid")
		if e.Details["status"] != "paid" {
			t.Fatalf("%s on paid names %v", name, e.Details)
		}
	}
	if h := f.history(d.ID); h != "->draft draft>issued issued>due due>partially_paid partially_paid>paid " {
		t.Fatalf("history %q", h)
	}
	if n := f.count(`SELECT count(*) FROM outbox_events WHERE event_type IN ('invoice.issued', 'invoice.paid')`); n != 2 {
		t.Fatalf("%d issued/paid events", n)
	}
	if n := f.count(`SELECT count(*) FROM audit_events WHERE action = 'billing.invoice.issue' AND target_id = $1`, d.ID.String()); n != 1 {
		t.Fatalf("%d issue audits", n)
	}
	if v := testutil.ToFloat64(f.svc.Metrics.Transitions.WithLabelValues("paid")); v != 1 {
		t.Fatalf("paid counter %v", v)
	}
}

func TestWriteOffFromDueAndPartiallyPaid(t *testing.T) {
	f := newFixture(t)
	for _, partial := range []bool{false, true} {
		d := f.dueDraft()
		if _, err := f.svc.Issue(f.ctx, d.ID); err != nil {
			t.Fatal(err)
		}
		if partial {
			if _, err := f.svc.Pay(f.ctx, invoices.Payment{InvoiceID: d.ID, Amount: 5, Currency: "USD", Reference: "wo-" + d.ID.String()}); err != nil {
				t.Fatal(err)
			}
		}
		inv, err := f.svc.WriteOff(f.ctx, d.ID, "customer insolvent")
		if err != nil || inv.Status != invoices.StatusWriteOff {
			t.Fatalf("write off (partial %v): %v", partial, err)
		}
		_, err = f.svc.WriteOff(f.ctx, d.ID, "")
		e := wantErr(t, err, apierr.InvalidRequest, 409, "invoice_state_invalid")
		if e.Details["status"] != "write_off" {
			t.Fatalf("names %v", e.Details)
		}
		_, err = f.svc.Void(f.ctx, d.ID, "", true)
		wantErr(t, err, apierr.InvalidRequest, 409, "invoice_state_invalid")
	}
	if n := f.count(`SELECT count(*) FROM audit_events WHERE action = 'billing.invoice.write_off'`); n != 2 {
		t.Fatalf("%d write-off audits", n)
	}
}

// A fully prepaid invoice stays issued; voiding it re-credits exactly what the wallet
// paid, once.
func TestVoidPrepaidRecreditsExactly(t *testing.T) {
	f := newFixture(t)
	tenant, proj := f.tenant()
	f.topUp(tenant, "USD", 1000)
	f.usage(tenant, proj, "USD", 3, midMarch, midMarch.Add(77*time.Second)) // 231
	f.clk.Set(april.Add(time.Hour))
	d := f.close(tenant, "USD", march, april).Invoice
	inv, err := f.svc.Issue(f.ctx, d.ID)
	if err != nil || inv.Status != invoices.StatusIssued || inv.AmountDue() != 0 || inv.Totals.Prepaid != 231 {
		t.Fatalf("issue prepaid: %v %s %+v", err, inv.Status, inv.Totals)
	}
	before := f.wallet(tenant, "USD")
	if before != 1000-231 {
		t.Fatalf("wallet %d", before)
	}
	_, err = f.svc.Void(f.ctx, d.ID, "billed in error", false)
	wantErr(t, err, apierr.InvalidRequest, 409, "void_requires_recredit")
	if w := f.wallet(tenant, "USD"); w != before {
		t.Fatalf("a refused void moved the wallet: %d", w)
	}
	inv, err = f.svc.Void(f.ctx, d.ID, "billed in error", true)
	if err != nil || inv.Status != invoices.StatusVoid {
		t.Fatalf("void: %v", err)
	}
	if w := f.wallet(tenant, "USD"); w != before+231 {
		t.Fatalf("wallet after void %d, want %d", w, before+231)
	}
	_, err = f.svc.Void(f.ctx, d.ID, "", true)
	e := wantErr(t, err, apierr.InvalidRequest, 409, "invoice_state_invalid")
	if e.Details["status"] != "void" {
		t.Fatalf("names %v", e.Details)
	}
	if w := f.wallet(tenant, "USD"); w != before+231 {
		t.Fatalf("second void moved the wallet: %d", w)
	}
	// The re-credit is the voided invoice's, not a payment on the next one; the voided
	// usage is not billed again.
	f.clk.Set(may.Add(time.Hour))
	apr := f.get(f.close(tenant, "USD", april, may).Invoice.ID)
	if len(apr.Lines) != 0 {
		t.Fatalf("April lines %+v", apr.Lines)
	}
	if n := f.count(`SELECT count(*) FROM outbox_events WHERE event_type = 'invoice.voided'`); n != 1 {
		t.Fatalf("%d voided events", n)
	}
	// A draft voids too (nothing numbered).
	d2 := f.dueDraft()
	if inv, err := f.svc.Void(f.ctx, d2.ID, "", true); err != nil || inv.Number != nil {
		t.Fatalf("void draft: %v", err)
	}
}

// Twenty issuers at once, plus five that issue an invoice another issuer also issues
// (and fail): numbers 1..20 exactly, no gap, no duplicate.
func TestGaplessNumberingUnderConcurrentIssuers(t *testing.T) {
	f := newFixture(t)
	var drafts []uuid.UUID
	for range 20 {
		drafts = append(drafts, f.dueDraft().ID)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var numbers []string
	fails := 0
	start := make(chan struct{})
	for i := range 25 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			inv, err := f.svc.Issue(f.ctx, drafts[i%20])
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if e, ok := apierr.As(err); ok && e.HTTPStatus() == 409 {
					fails++
					return
				}
				t.Errorf("issue: %v", err)
				return
			}
			numbers = append(numbers, *inv.Number)
		}()
	}
	close(start)
	wg.Wait()
	sort.Strings(numbers)
	if len(numbers) != 20 || fails != 5 {
		t.Fatalf("%d issued, %d refused", len(numbers), fails)
	}
	for i, n := range numbers {
		if want := fmt.Sprintf("GNT-%06d", i+1); n != want {
			t.Fatalf("numbers %v", numbers)
		}
	}
	if n := f.count(`SELECT count(DISTINCT sequence_number) FROM billing_invoices WHERE sequence_number BETWEEN 1 AND 20`); n != 20 {
		t.Fatalf("%d distinct numbers stored", n)
	}
	if n := f.count(`SELECT last_number FROM billing_invoice_sequences WHERE seller_key = 'platform'`); n != 20 {
		t.Fatalf("sequence at %d", n)
	}
}

// The counters are on the registry, lint-clean, and count what happened.
func TestMetrics(t *testing.T) {
	f := newFixture(t)
	d := f.dueDraft()
	if _, err := f.svc.Issue(f.ctx, d.ID); err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.GatherAndLint(f.reg)
	if err != nil || len(problems) != 0 {
		t.Fatalf("lint: %v %v", err, problems)
	}
	if v := testutil.ToFloat64(f.svc.Metrics.Closed); v != 1 {
		t.Fatalf("closed %v", v)
	}
	for st, want := range map[string]float64{"issued": 1, "due": 1, "paid": 0} {
		if v := testutil.ToFloat64(f.svc.Metrics.Transitions.WithLabelValues(st)); v != want {
			t.Fatalf("%s: %v, want %v", st, v, want)
		}
	}
}

// Each seller numbers on its own: a reseller's invoices do not take the platform's
// numbers.
func TestNumbersPerSeller(t *testing.T) {
	f := newFixture(t)
	reseller := uuid.MustParse("0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")
	a := f.dueDraft()
	b := f.dueDraft()
	f.svc.Accounts = accountsFunc(func(tenantID uuid.UUID) (invoices.Account, error) {
		return invoices.Account{TenantID: tenantID, SellerKey: "reseller:" + reseller.String(), SellerName: "Reseller Ltd",
			CustomerName: "End customer", PaymentTermsDays: 30, Tax: invoices.TaxProfile{Treatment: invoices.TreatmentNotConfigured}}, nil
	})
	c := f.dueDraft()
	var got []string
	for _, id := range []uuid.UUID{a.ID, c.ID, b.ID} {
		inv, err := f.svc.Issue(f.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, *inv.Number)
	}
	if want := []string{"GNT-000001", "R0193A1B2-000001", "GNT-000002"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("numbers %v, want %v", got, want)
	}
}
