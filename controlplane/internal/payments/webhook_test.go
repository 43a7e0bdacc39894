package payments_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/payments"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

func TestWebhookCapturesAndCreditsOnce(t *testing.T) {
	f := newFixture(t)
	tu := f.topUp("USD", 5000)
	if tu.Payment.Status != "created" || tu.ClientSecret == "" || tu.Payment.ProviderPaymentID == nil {
		t.Fatalf("top-up = %+v", tu)
	}
	pi := *tu.Payment.ProviderPaymentID
	f.fake.Succeed(pi)
	body := f.fake.Event("payment_intent.succeeded", pi)

	ack := f.mustDeliver(body)
	if ack.Duplicate || ack.EventID == "" {
		t.Fatalf("first delivery ack = %+v", ack)
	}
	p := f.payment(tu.Payment.ID)
	if p.Status != "succeeded" || p.CapturedMinor != 5000 || p.CapturedAt == nil || !p.CapturedAt.Equal(t0) || !p.LedgerTxnID.Valid {
		t.Fatalf("payment after capture = %+v", p)
	}
	if got := f.balance("USD"); got != 5000 {
		t.Fatalf("wallet = %d, want 5000", got)
	}

	// The provider redelivers the same event (same id): stored once, credited once.
	f.clk.Advance(time.Minute)
	if ack := f.mustDeliver(body); !ack.Duplicate {
		t.Fatalf("redelivery ack = %+v, want duplicate", ack)
	}
	if got := f.balance("USD"); got != 5000 {
		t.Fatalf("wallet after redelivery = %d, want 5000", got)
	}
	if n := f.count(`SELECT count(*) FROM payment_webhook_events WHERE status = 'processed'`); n != 1 {
		t.Fatalf("processed events = %d", n)
	}
	if n := f.count(`SELECT count(*) FROM outbox_events WHERE event_type = 'payment.succeeded'`); n != 1 {
		t.Fatalf("payment.succeeded events = %d", n)
	}
	if n := f.count(`SELECT count(*) FROM audit_events WHERE action = 'payment.capture' AND actor_type = 'system'`); n != 1 {
		t.Fatalf("payment.capture audit rows = %d", n)
	}
	m := f.svc.Metrics
	if metric(m.Received) != 2 || metric(m.ProcessedSuccess) != 1 || metric(m.SignatureFailures) != 0 {
		t.Fatalf("counters received=%d processed=%d sigfail=%d", metric(m.Received), metric(m.ProcessedSuccess), metric(m.SignatureFailures))
	}
}

// Concurrent deliveries of one event (the provider retrying while the first delivery
// is still running) credit the wallet once.
func TestWebhookConcurrentDuplicatesCreditOnce(t *testing.T) {
	f := newFixture(t)
	tu := f.topUp("USD", 2500)
	pi := *tu.Payment.ProviderPaymentID
	f.fake.Succeed(pi)
	body := f.fake.Event("payment_intent.succeeded", pi)
	// A second, distinct event saying the same thing (payment_intent.succeeded again
	// under a new event id) races along.
	other := f.fake.Event("payment_intent.succeeded", pi)

	const n = 12
	var wg sync.WaitGroup
	acks := make([]payments.Ack, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := body
			if i%4 == 3 {
				b = other
			}
			acks[i], errs[i] = f.deliver(b)
		}()
	}
	wg.Wait()
	firsts := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("delivery %d: %v", i, errs[i])
		}
		if !acks[i].Duplicate {
			firsts++
		}
	}
	if firsts != 2 {
		t.Fatalf("non-duplicate deliveries = %d, want 2 (one per event id)", firsts)
	}
	if got := f.balance("USD"); got != 2500 {
		t.Fatalf("wallet = %d, want 2500 (credited once)", got)
	}
	if got := f.count(`SELECT count(*) FROM billing_ledger_transactions`); got != 1 {
		t.Fatalf("ledger transactions = %d, want 1", got)
	}
	if got := f.count(`SELECT count(*) FROM payment_webhook_events`); got != 2 {
		t.Fatalf("stored events = %d, want 2", got)
	}
	if got := f.count(`SELECT count(*) FROM outbox_events WHERE event_type = 'payment.succeeded'`); got != 1 {
		t.Fatalf("payment.succeeded events = %d, want 1", got)
	}
}

// A refused webhook writes nothing anywhere and counts a signature failure.
func TestWebhookRefusedSignatureWritesNothing(t *testing.T) {
	f := newFixture(t, func(c *payments.Config) { c.WebhookMaxBody = 4096 })
	tu := f.topUp("USD", 1000)
	pi := *tu.Payment.ProviderPaymentID
	f.fake.Succeed(pi)
	body := f.fake.Event("payment_intent.succeeded", pi)
	now := f.clk.Now()
	changed := bytes.Replace(body, []byte(`"amount_received":1000`), []byte(`"amount_received":9000`), 1)
	if bytes.Equal(changed, body) {
		t.Fatal("test body did not change")
	}
	big := append(bytes.TrimSuffix(body, []byte("}")), []byte(`,"pad":"`+strings.Repeat("x", 4096)+`"}`)...)

	cases := []struct {
		name   string
		header string
		body   []byte
		reason string
	}{
		{"amount changed after signing", f.sign(body), changed, "signature_mismatch"},
		{"signed with an unknown secret", f.sign(body, secretB), body, "signature_mismatch"},
		{"stale", signAt(body, now.Add(-301*time.Second)), body, "timestamp_too_old"},
		{"future", signAt(body, now.Add(31*time.Second)), body, "timestamp_in_future"},
		{"no header", "", body, "signature_missing"},
		{"body over the cap, correctly signed", f.sign(big), big, "body_too_large"},
	}
	before := f.rows()
	m := f.svc.Metrics
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.svc.ReceiveWebhook(context.Background(), payments.ProviderStripe, tc.header, bytes.NewReader(tc.body))
			e := wantCode(t, err, apierr.PaymentSignatureInvalid, 400)
			wantReason(t, e, tc.reason)
			if got := metric(m.SignatureFailures); got != i+1 {
				t.Fatalf("webhook_signature_failures_total = %d, want %d", got, i+1)
			}
			sameRows(t, before, f.rows())
		})
	}
	if got := f.balance("USD"); got != 0 {
		t.Fatalf("wallet = %d", got)
	}
	if metric(m.Received) != len(cases) || metric(m.ProcessedSuccess) != 0 || metric(m.PersistFailures) != 0 {
		t.Fatalf("received=%d processed=%d", metric(m.Received), metric(m.ProcessedSuccess))
	}
}

func signAt(body []byte, at time.Time) string {
	return payments.Sign(body, at, []byte(secretA))
}

// During a secret rotation both secrets are configured, and deliveries signed with
// either verify.
func TestWebhookRotatedSecrets(t *testing.T) {
	f := newFixture(t, func(c *payments.Config) { c.WebhookSecrets = []string{secretB, secretA} })
	tu := f.topUp("USD", 700)
	pi := *tu.Payment.ProviderPaymentID
	f.fake.Process(pi)
	byOld := f.fake.Event("payment_intent.processing", pi)
	if _, err := f.svc.ReceiveWebhook(context.Background(), payments.ProviderStripe, f.sign(byOld, secretA), bytes.NewReader(byOld)); err != nil {
		t.Fatalf("signed with the old secret: %v", err)
	}
	f.fake.Succeed(pi)
	byNew := f.fake.Event("payment_intent.succeeded", pi)
	if _, err := f.svc.ReceiveWebhook(context.Background(), payments.ProviderStripe, f.sign(byNew, secretB), bytes.NewReader(byNew)); err != nil {
		t.Fatalf("signed with the new secret: %v", err)
	}
	if p := f.payment(tu.Payment.ID); p.Status != "succeeded" || f.balance("USD") != 700 {
		t.Fatalf("payment %s, wallet %d", p.Status, f.balance("USD"))
	}
}

func TestWebhookInvalidPayload(t *testing.T) {
	f := newFixture(t)
	before := f.rows()
	for i, body := range []string{
		`not json`,
		`{"object":"event","type":"payment_intent.succeeded"}`,
		`{"id":"evt_x","object":"event","type":"payment_intent.succeeded","data":{"object":{"id":"pi_1","currency":"usd"}}}`,
		`{"id":"evt_y","object":"event","type":"payment_intent.succeeded","data":{"object":{"id":"pi_1","amount":100,"amount_received":0,"currency":"usd"}}}`,
		`{"id":"evt with spaces","object":"event","type":"ping"}`,
	} {
		_, err := f.deliver([]byte(body))
		e := wantCode(t, err, apierr.InvalidRequest, 400)
		wantReason(t, e, "invalid_payload")
		if got := metric(f.svc.Metrics.InvalidPayload); got != i+1 {
			t.Fatalf("webhook_invalid_payload_total = %d, want %d", got, i+1)
		}
	}
	sameRows(t, before, f.rows())
}

// A late or out-of-order event never moves a payment backwards.
func TestWebhookForwardOnly(t *testing.T) {
	f := newFixture(t)
	tu := f.topUp("USD", 1200)
	pi := *tu.Payment.ProviderPaymentID

	// Events are built in the order the provider emitted them ...
	f.fake.Process(pi)
	processing := f.fake.Event("payment_intent.processing", pi)
	f.fake.Fail(pi, "card_declined")
	failed := f.fake.Event("payment_intent.payment_failed", pi)
	f.fake.Succeed(pi)
	succeeded := f.fake.Event("payment_intent.succeeded", pi)
	canceled := f.fake.Event("payment_intent.canceled", pi)

	// ... and delivered out of order: the failure first, then the retry that captured,
	// then the stale processing event and a canceled one.
	f.mustDeliver(failed)
	if p := f.payment(tu.Payment.ID); p.Status != "failed" || p.FailureCode == nil || *p.FailureCode != "card_declined" {
		t.Fatalf("after failed: %+v", p)
	}
	f.mustDeliver(succeeded)
	if p := f.payment(tu.Payment.ID); p.Status != "succeeded" || p.FailureCode != nil || f.balance("USD") != 1200 {
		t.Fatalf("after succeeded: %+v, wallet %d", p, f.balance("USD"))
	}
	f.mustDeliver(processing)
	f.mustDeliver(failed) // a redelivery: already stored and applied
	f.mustDeliver(canceled)
	p := f.payment(tu.Payment.ID)
	if p.Status != "succeeded" || p.CapturedMinor != 1200 || f.balance("USD") != 1200 {
		t.Fatalf("late events moved the payment: %+v, wallet %d", p, f.balance("USD"))
	}
	if n := f.count(`SELECT count(*) FROM payment_webhook_events WHERE status = 'ignored' AND last_error LIKE 'no_transition_succeeded_to_%'`); n != 2 {
		t.Fatalf("ignored late events = %d, want 2", n)
	}
	if n := f.count(`SELECT count(*) FROM audit_events WHERE target_id = $1`, p.ID.String()); n != 3 {
		t.Fatalf("audit rows = %d, want 3 (create, fail, capture)", n)
	}
}

func TestWebhookForeignObjectIgnored(t *testing.T) {
	f := newFixture(t)
	body := []byte(`{"id":"evt_foreign","object":"event","type":"payment_intent.succeeded","created":1700000000,
		"data":{"object":{"id":"pi_not_ours","object":"payment_intent","amount":100,"amount_received":100,"currency":"usd","status":"succeeded","metadata":{}}}}`)
	f.mustDeliver(body)
	if n := f.count(`SELECT count(*) FROM payment_webhook_events WHERE status = 'ignored' AND last_error = 'not_a_gantry_payment'`); n != 1 {
		t.Fatalf("ignored = %d", n)
	}
	f.mustDeliver([]byte(`{"id":"evt_ping","object":"event","type":"customer.created","data":{"object":{}}}`))
	if n := f.count(`SELECT count(*) FROM payment_webhook_events WHERE status = 'ignored'`); n != 2 {
		t.Fatalf("ignored = %d", n)
	}
}

// A refund made in the provider's dashboard reaches us as charge.refunded with the
// cumulative amount; it is recorded and debited once, and an older event is ignored.
func TestWebhookDashboardRefund(t *testing.T) {
	f := newFixture(t)
	p := f.captured(1000)
	pi := *p.ProviderPaymentID
	f.fake.DashboardRefund(pi, 300)
	first := f.fake.Event("charge.refunded", pi)
	f.fake.DashboardRefund(pi, 200)
	second := f.fake.Event("charge.refunded", pi)

	f.mustDeliver(second) // cumulative 500
	f.mustDeliver(first)  // cumulative 300: older, ignored
	got := f.payment(p.ID)
	if got.Status != "partially_refunded" || got.RefundedMinor != 500 || f.balance("USD") != 500 {
		t.Fatalf("payment %+v wallet %d", got, f.balance("USD"))
	}
	if n := f.count(`SELECT count(*) FROM payment_refunds WHERE origin = 'provider' AND amount_minor = 500`); n != 1 {
		t.Fatalf("provider refunds = %d", n)
	}
}

// An event that cannot be applied yet (a refund seen before its capture) is kept,
// counted as a processing failure, and applied by Reconcile once it can be.
func TestWebhookFailedEventRetriedByReconcile(t *testing.T) {
	f := newFixture(t)
	tu := f.topUp("USD", 800)
	pi := *tu.Payment.ProviderPaymentID
	f.fake.Succeed(pi)
	succeeded := f.fake.Event("payment_intent.succeeded", pi)
	f.fake.DashboardRefund(pi, 800)
	refunded := f.fake.Event("charge.refunded", pi)

	_, err := f.deliver(refunded)
	wantCode(t, err, apierr.InternalError, 500)
	if metric(f.svc.Metrics.ProcessingFailures) != 1 {
		t.Fatalf("processing failures = %d", metric(f.svc.Metrics.ProcessingFailures))
	}
	if n := f.count(`SELECT count(*) FROM payment_webhook_events WHERE status = 'failed' AND attempts = 1`); n != 1 {
		t.Fatalf("failed events = %d", n)
	}
	f.mustDeliver(succeeded)
	f.clk.Advance(2 * time.Minute)
	rep, err := f.svc.Reconcile(context.Background())
	if err != nil || rep.EventsRetried != 1 || rep.Failed != 0 {
		t.Fatalf("reconcile = %+v, %v", rep, err)
	}
	if p := f.payment(tu.Payment.ID); p.Status != "refunded" || f.balance("USD") != 0 {
		t.Fatalf("payment %+v wallet %d", p, f.balance("USD"))
	}
	if metric(f.svc.Metrics.ReconcileFailed) != 0 {
		t.Fatal("reconcile counted a failure")
	}
}

// A payment whose webhook never arrived is read back from the provider and credited
// once.
func TestReconcileReadsBackQuietPayments(t *testing.T) {
	f := newFixture(t)
	tu := f.topUp("USD", 450)
	f.fake.Succeed(*tu.Payment.ProviderPaymentID)
	abandoned := f.topUp("USD", 99)

	rep, err := f.svc.Reconcile(context.Background())
	if err != nil || rep.PaymentsChecked != 0 {
		t.Fatalf("too early: %+v %v", rep, err)
	}
	f.clk.Advance(payments.DefaultReconcileAfter + time.Second)
	for range 2 {
		if _, err := f.svc.Reconcile(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if p := f.payment(tu.Payment.ID); p.Status != "succeeded" || f.balance("USD") != 450 {
		t.Fatalf("payment %+v wallet %d", p, f.balance("USD"))
	}
	if p := f.payment(abandoned.Payment.ID); p.Status != "created" {
		t.Fatalf("abandoned payment moved: %s", p.Status)
	}

	// The provider failing counts in payments_reconcile_failed_total.
	f.fake.Close()
	if _, err := f.svc.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := metric(f.svc.Metrics.ReconcileFailed); got != 1 {
		t.Fatalf("payments_reconcile_failed_total = %d, want 1", got)
	}
}
