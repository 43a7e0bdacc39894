package payments_test

import (
	"context"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/payments"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

func TestTopUpCreatesProviderPaymentWithEventAndAudit(t *testing.T) {
	f := newFixture(t)
	tu := f.topUp("EUR", 2000)
	in, ok := f.fake.Intent(*tu.Payment.ProviderPaymentID)
	if !ok || in.Amount != 2000 || in.Currency != "eur" || in.Metadata["gantry_payment_id"] != tu.Payment.ID.String() ||
		in.Metadata["gantry_tenant_id"] != f.tenant.String() || tu.ClientSecret != in.ClientSecret {
		t.Fatalf("provider intent %+v for %+v", in, tu)
	}
	if n := f.count(`SELECT count(*) FROM outbox_events WHERE event_type = 'payment.created'`); n != 1 {
		t.Fatalf("payment.created = %d", n)
	}
	if n := f.count(`SELECT count(*) FROM audit_events WHERE action = 'payment.create' AND tenant_id = $1`, f.tenant); n != 1 {
		t.Fatalf("audit = %d", n)
	}
	if n := f.count(`SELECT count(*) FROM outbox_events WHERE payload::text LIKE '%secret%'`); n != 0 {
		t.Fatal("an event carries the client secret")
	}
	pg, err := f.svc.ListTenant(context.Background(), f.tenant, [16]byte{}, 50)
	if err != nil || len(pg.Items) != 1 || pg.Items[0].ID != tu.Payment.ID {
		t.Fatalf("list = %+v, %v", pg, err)
	}
}

func TestTopUpValidationWritesNothing(t *testing.T) {
	f := newFixture(t)
	before := f.rows()
	cases := []struct {
		currency string
		amount   int64
		reason   string
	}{
		{"usd", 100, "invalid_currency"},
		{"US", 100, "invalid_currency"},
		{"USD", 0, "amount_not_positive"},
		{"USD", -5, "amount_not_positive"},
		{"USD", payments.MaxAmountMinor + 1, "amount_too_large"},
		{"CHF", 100, "currency_not_supported"},
	}
	for _, tc := range cases {
		_, err := f.svc.CreateTopUp(context.Background(), f.tenant, f.admin, tc.currency, tc.amount)
		wantReason(t, wantCode(t, err, apierr.ValidationError, 422), tc.reason)
	}
	if _, err := f.svc.CreateTopUp(context.Background(), f.tenant, f.admin, "USD", payments.MaxAmountMinor); err != nil {
		t.Fatalf("the largest amount: %v", err)
	}
	after := f.rows()
	after["payments"]--
	after["outbox_events"]--
	after["audit_events"]--
	sameRows(t, before, after)
	if f.fake.Requests() != 1 {
		t.Fatalf("provider requests = %d, want 1", f.fake.Requests())
	}
}

func TestTopUpProviderFailures(t *testing.T) {
	t.Run("not configured", func(t *testing.T) {
		f := newFixture(t, func(c *payments.Config) { c.ProviderAPIKey = "" })
		before := f.rows()
		_, err := f.svc.CreateTopUp(context.Background(), f.tenant, f.admin, "USD", 100)
		wantCode(t, err, apierr.ServiceUnavailable, 503)
		sameRows(t, before, f.rows())
	})
	t.Run("wrong api key", func(t *testing.T) {
		f := newFixture(t, func(c *payments.Config) { c.ProviderAPIKey = "sk_wrong" })
		before := f.rows()
		_, err := f.svc.CreateTopUp(context.Background(), f.tenant, f.admin, "USD", 100)
		e := wantCode(t, err, apierr.UpstreamError, 502)
		if e.Details["provider_code"] != "api_key_invalid" {
			t.Fatalf("details = %v", e.Details)
		}
		sameRows(t, before, f.rows())
	})
	t.Run("provider down", func(t *testing.T) {
		f := newFixture(t)
		f.fake.Close()
		before := f.rows()
		_, err := f.svc.CreateTopUp(context.Background(), f.tenant, f.admin, "USD", 100)
		wantCode(t, err, apierr.UpstreamError, 502)
		sameRows(t, before, f.rows())
	})
}
