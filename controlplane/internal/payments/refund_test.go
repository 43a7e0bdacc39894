package payments_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/payments"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

func (f *fixture) refund(p payments.Payment, amount int64) (payments.Refund, payments.Payment, error) {
	return f.svc.Refund(context.Background(), payments.RefundRequestInput{
		PaymentID: p.ID, Currency: p.Currency, AmountMinor: amount, RequestedBy: f.admin,
	})
}

// The refund window is counted from capture; exactly the window is still inside, one
// second past it is refused. Edges at ±1 s with the manual clock.
func TestRefundWindowEdges(t *testing.T) {
	const window = 10 * 24 * time.Hour
	f := newFixture(t, func(c *payments.Config) { c.RefundWindow = window })
	p := f.captured(1000)
	capturedAt := *p.CapturedAt

	for _, tc := range []struct {
		at time.Duration
		ok bool
	}{
		{window - time.Second, true},
		{window, true},
		{window + time.Second, false},
	} {
		f.clk.Set(capturedAt.Add(tc.at))
		before := f.rows()
		_, _, err := f.refund(p, 100)
		if tc.ok {
			if err != nil {
				t.Fatalf("refund at capture+%s: %v", tc.at, err)
			}
			continue
		}
		e := wantCode(t, err, apierr.RefundWindowExceeded, 409)
		if e.Details["refund_window_seconds"] != int64(window.Seconds()) {
			t.Fatalf("details = %v", e.Details)
		}
		sameRows(t, before, f.rows())
	}
	if got := f.payment(p.ID); got.RefundedMinor != 200 || got.Status != "partially_refunded" {
		t.Fatalf("payment = %+v", got)
	}
	if n := len(f.fake.Refunds()); n != 2 {
		t.Fatalf("provider refunds = %d, want 2", n)
	}
	if got := f.balance("USD"); got != 800 {
		t.Fatalf("wallet = %d, want 800", got)
	}
}

func TestRefundNeverExceedsCapturedMinusRefunded(t *testing.T) {
	f := newFixture(t)
	p := f.captured(1000)
	if _, _, err := f.refund(p, 600); err != nil {
		t.Fatal(err)
	}
	before := f.rows()
	_, _, err := f.refund(p, 401)
	e := wantCode(t, err, apierr.InvalidRequest, 409)
	wantReason(t, e, "refund_exceeds_captured")
	if e.Details["refundable_minor"] != int64(400) {
		t.Fatalf("details = %v", e.Details)
	}
	sameRows(t, before, f.rows())

	ref, after, err := f.refund(p, 400)
	if err != nil {
		t.Fatal(err)
	}
	if ref.AmountMinor != 400 || ref.Origin != "admin" || ref.ProviderRefundID == nil || after.Status != "refunded" || after.RefundedMinor != 1000 {
		t.Fatalf("refund %+v payment %+v", ref, after)
	}
	_, _, err = f.refund(p, 1)
	wantReason(t, wantCode(t, err, apierr.InvalidRequest, 409), "refund_exceeds_captured")
	if got := f.balance("USD"); got != 0 {
		t.Fatalf("wallet = %d", got)
	}
	if n := f.count(`SELECT count(*) FROM outbox_events WHERE event_type = 'payment.refunded'`); n != 2 {
		t.Fatalf("payment.refunded events = %d", n)
	}
	if n := f.count(`SELECT count(*) FROM audit_events WHERE action = 'payment.refund' AND tenant_id = $1`, f.tenant); n != 2 {
		t.Fatalf("payment.refund audit rows = %d", n)
	}
}

// Concurrent refunds of one payment never add up to more than it captured.
func TestConcurrentRefunds(t *testing.T) {
	f := newFixture(t)
	p := f.captured(1000)
	const n = 10
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, errs[i] = f.refund(p, 300)
		}()
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		if err == nil {
			ok++
			continue
		}
		wantReason(t, wantCode(t, err, apierr.InvalidRequest, 409), "refund_exceeds_captured")
	}
	if ok != 3 {
		t.Fatalf("successful refunds = %d, want 3", ok)
	}
	got := f.payment(p.ID)
	if got.RefundedMinor != 900 || got.Status != "partially_refunded" {
		t.Fatalf("payment = %+v", got)
	}
	var sum int64
	for _, r := range f.fake.Refunds() {
		sum += r.Amount
	}
	if sum != 900 || f.balance("USD") != 100 {
		t.Fatalf("provider refunded %d, wallet %d", sum, f.balance("USD"))
	}
	if n := f.count(`SELECT count(*) FROM payment_refunds WHERE payment_id = $1`, p.ID); n != 3 {
		t.Fatalf("refund rows = %d", n)
	}
}

func TestRefundRefusals(t *testing.T) {
	f := newFixture(t)
	p := f.captured(1000)
	ctx := context.Background()

	t.Run("not captured", func(t *testing.T) {
		tu := f.topUp("USD", 500)
		_, _, err := f.refund(tu.Payment, 100)
		wantReason(t, wantCode(t, err, apierr.InvalidRequest, 409), "payment_not_refundable")
	})
	t.Run("unknown payment", func(t *testing.T) {
		_, _, err := f.svc.Refund(ctx, payments.RefundRequestInput{PaymentID: uuid.Must(uuid.NewV7()), Currency: "USD", AmountMinor: 1})
		e := wantCode(t, err, apierr.InvalidRequest, 404)
		wantReason(t, e, "not_found")
	})
	t.Run("other currency", func(t *testing.T) {
		_, _, err := f.svc.Refund(ctx, payments.RefundRequestInput{PaymentID: p.ID, Currency: "EUR", AmountMinor: 1})
		wantReason(t, wantCode(t, err, apierr.ValidationError, 422), "currency_mismatch")
	})
	t.Run("zero and too large", func(t *testing.T) {
		_, _, err := f.refund(p, 0)
		wantReason(t, wantCode(t, err, apierr.ValidationError, 422), "amount_not_positive")
		_, _, err = f.refund(p, payments.MaxAmountMinor+1)
		wantReason(t, wantCode(t, err, apierr.ValidationError, 422), "amount_too_large")
	})
	t.Run("provider refuses: nothing recorded", func(t *testing.T) {
		before := f.rows()
		f.fake.RefuseRefunds(true)
		defer f.fake.RefuseRefunds(false)
		_, _, err := f.refund(p, 100)
		e := wantCode(t, err, apierr.UpstreamError, 502)
		if e.Details["provider_code"] != "refund_declined" {
			t.Fatalf("details = %v", e.Details)
		}
		sameRows(t, before, f.rows())
	})
	t.Run("wallet already spent", func(t *testing.T) {
		// The tenant spent 950 of the 1000 it topped up.
		err := db.InTx(ctx, f.pool, func(tx pgx.Tx) error {
			_, err := f.bill.Ledger.DebitRefund(ctx, tx, f.tenant, "USD", 950, uuid.Must(uuid.NewV7()))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		before := f.rows()
		calls := f.fake.Requests()
		_, _, err = f.refund(p, 100)
		wantCode(t, err, apierr.InsufficientBalance, 402)
		sameRows(t, before, f.rows())
		if f.fake.Requests() != calls {
			t.Fatal("the provider was asked to refund money the wallet no longer holds")
		}
	})
}
