package payments_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/payments/stripefake"
	"github.com/gantry-gpu/gantry/proto/api"
)

func ptr[T any](v T) *T { return &v }

// The whole top-up flow through the API, the real billing ledger and the provider fake:
// create top-up -> the customer pays at the provider -> signed webhook -> the wallet
// balance (GET /api/v1/billing/balance) grows; then an admin refund.
func TestTopUpFlowThroughAPI(t *testing.T) {
	fake := stripefake.New(apiKey)
	t.Cleanup(fake.Close)
	env := apitest.New(t, apitest.WithConfig(func(c *app.Config) {
		c.Payments = app.PaymentsConfig{
			ProviderBaseURL: fake.URL, ProviderAPIKey: apiKey, WebhookSecrets: []string{secretB, secretA},
			RefundWindow: 24 * time.Hour,
		}
	}))
	ctx := context.Background()
	rootID, root := env.PlatformAdmin(t)
	ten := env.NewTenant(t, root, "Acme GPU")
	tenant := env.Client(ten.AdminToken)

	balance := func() api.BillingBalanceResponse {
		t.Helper()
		resp, err := tenant.GetBillingBalanceWithResponse(ctx, &api.GetBillingBalanceParams{})
		if err != nil || resp.JSON200 == nil {
			t.Fatalf("balance: %v %d %s", err, resp.StatusCode(), resp.Body)
		}
		return *resp.JSON200
	}
	usd := func(b api.BillingBalanceResponse) int64 {
		for _, m := range b.Balances {
			if m.Currency == "USD" {
				return m.AmountMinor
			}
		}
		return 0
	}
	startUSD := usd(balance())

	// A member may not top up; bad amounts are refused.
	_, member := env.NewUser(t, ten.AdminToken, "member")
	resp, err := env.Client(member).CreatePaymentTopUpWithResponse(ctx, &api.CreatePaymentTopUpParams{},
		api.CreatePaymentTopUpRequest{Amount: api.Money{AmountMinor: 5000, Currency: "USD"}})
	if err != nil || resp.StatusCode() != http.StatusForbidden {
		t.Fatalf("member top-up: %v %d %s", err, resp.StatusCode(), resp.Body)
	}
	resp, err = tenant.CreatePaymentTopUpWithResponse(ctx, &api.CreatePaymentTopUpParams{},
		api.CreatePaymentTopUpRequest{Amount: api.Money{AmountMinor: 0, Currency: "USD"}})
	if err != nil || resp.StatusCode() != http.StatusUnprocessableEntity || resp.JSON422.Code != "validation_error" {
		t.Fatalf("zero top-up: %v %d %s", err, resp.StatusCode(), resp.Body)
	}

	// Create the top-up (idempotently: a retry with the same key is the same payment).
	params := &api.CreatePaymentTopUpParams{IdempotencyKey: ptr("topup-1")}
	body := api.CreatePaymentTopUpRequest{Amount: api.Money{AmountMinor: 5000, Currency: "USD"}}
	resp, err = tenant.CreatePaymentTopUpWithResponse(ctx, params, body)
	if err != nil || resp.StatusCode() != http.StatusCreated {
		t.Fatalf("top-up: %v %d %s", err, resp.StatusCode(), resp.Body)
	}
	created := *resp.JSON201
	if created.Payment.Status != api.PaymentStatusCreated || created.ClientSecret == nil || created.Payment.ProviderPaymentID == nil {
		t.Fatalf("created = %+v", created)
	}
	replay, err := tenant.CreatePaymentTopUpWithResponse(ctx, params, body)
	if err != nil || replay.StatusCode() != http.StatusCreated || replay.JSON201.Payment.ID != created.Payment.ID {
		t.Fatalf("replay: %v %d %s", err, replay.StatusCode(), replay.Body)
	}
	pi := *created.Payment.ProviderPaymentID

	// The customer pays; the provider sends the signed event.
	fake.Succeed(pi)
	event := fake.Event("payment_intent.succeeded", pi)
	deliver := func(body []byte, sig string) *http.Response {
		req := env.Request(http.MethodPost, "/api/v1/payments/webhooks/stripe", "", string(body))
		req.Header.Set("Content-Type", "application/json; charset=utf-8")
		if sig != "" {
			req.Header.Set("Stripe-Signature", sig)
		}
		return env.Do(req)
	}
	// A forged delivery first: refused, nothing credited.
	forged := bytes.Replace(event, []byte(`"amount_received":5000`), []byte(`"amount_received":4999`), 1)
	r := deliver(forged, stripefake.Sign(event, time.Now(), secretA))
	errBody := readJSON[api.ErrorResponse](t, r)
	if r.StatusCode != http.StatusBadRequest || errBody.Code != "payment_signature_invalid" {
		t.Fatalf("forged delivery: %d %+v", r.StatusCode, errBody)
	}
	// Not JSON, and no signature: still a signature failure, never a parse error.
	r = deliver([]byte("{{{"), "")
	if r.StatusCode != http.StatusBadRequest || readJSON[api.ErrorResponse](t, r).Code != "payment_signature_invalid" {
		t.Fatalf("unsigned garbage: %d", r.StatusCode)
	}
	if got := usd(balance()); got != startUSD {
		t.Fatalf("balance moved on a forged webhook: %d", got)
	}

	r = deliver(event, stripefake.Sign(event, time.Now(), secretA))
	ack := readJSON[api.PaymentWebhookAck](t, r)
	if r.StatusCode != http.StatusOK || !ack.Received || ack.Duplicate || ack.EventID == "" {
		t.Fatalf("webhook: %d %+v", r.StatusCode, ack)
	}
	r = deliver(event, stripefake.Sign(event, time.Now(), secretB)) // redelivered, signed with the newer secret
	if ack := readJSON[api.PaymentWebhookAck](t, r); r.StatusCode != http.StatusOK || !ack.Duplicate {
		t.Fatalf("redelivery: %d %+v", r.StatusCode, ack)
	}
	if got := usd(balance()); got != startUSD+5000 {
		t.Fatalf("USD balance = %d, want %d", got, startUSD+5000)
	}

	// The tenant sees its payment captured.
	list, err := tenant.ListPaymentsWithResponse(ctx, &api.ListPaymentsParams{})
	if err != nil || list.JSON200 == nil || len(list.JSON200.Items) != 1 {
		t.Fatalf("list: %v %s", err, list.Body)
	}
	if p := list.JSON200.Items[0]; p.Status != api.PaymentStatusSucceeded || p.Captured.AmountMinor != 5000 || p.CapturedAt == nil {
		t.Fatalf("payment = %+v", p)
	}

	// Admin views and refunds; a tenant admin may not.
	if r, _ := tenant.ListAdminPaymentsWithResponse(ctx, &api.ListAdminPaymentsParams{}); r.StatusCode() != http.StatusForbidden || r.JSON403.Code != "admin_required" {
		t.Fatalf("tenant admin on admin list: %d", r.StatusCode())
	}
	admin := env.Client(root)
	al, err := admin.ListAdminPaymentsWithResponse(ctx, &api.ListAdminPaymentsParams{TenantID: &ten.ID, Status: ptr(api.PaymentStatusSucceeded)})
	if err != nil || al.JSON200 == nil || len(al.JSON200.Items) != 1 {
		t.Fatalf("admin list: %v %s", err, al.Body)
	}
	rf, err := admin.CreatePaymentRefundWithResponse(ctx, created.Payment.ID, &api.CreatePaymentRefundParams{IdempotencyKey: ptr("refund-1")},
		api.CreatePaymentRefundRequest{Amount: api.Money{AmountMinor: 1500, Currency: "USD"}, Reason: ptr("customer asked")})
	if err != nil || rf.StatusCode() != http.StatusCreated {
		t.Fatalf("refund: %v %d %s", err, rf.StatusCode(), rf.Body)
	}
	if rf.JSON201.Payment.Status != api.PaymentStatusPartiallyRefunded || rf.JSON201.Refund.Amount.AmountMinor != 1500 {
		t.Fatalf("refund = %+v", rf.JSON201)
	}
	over, _ := admin.CreatePaymentRefundWithResponse(ctx, created.Payment.ID, &api.CreatePaymentRefundParams{},
		api.CreatePaymentRefundRequest{Amount: api.Money{AmountMinor: 3501, Currency: "USD"}})
	if over.StatusCode() != http.StatusConflict || over.JSON409.Code != "invalid_request" {
		t.Fatalf("over-refund: %d %s", over.StatusCode(), over.Body)
	}
	if got := usd(balance()); got != startUSD+3500 {
		t.Fatalf("USD balance after refund = %d, want %d", got, startUSD+3500)
	}
	var actor string
	if err := env.Pool.QueryRow(ctx, `SELECT actor_user_id::text FROM audit_events WHERE action = 'payment.refund'`).Scan(&actor); err != nil || actor != rootID.String() {
		t.Fatalf("refund audit actor = %q, %v", actor, err)
	}

	// The webhook worker's counters are on the app's /metrics.
	for name, want := range map[string]float64{
		"webhook_events_received_total": 4, "webhook_signature_failures_total": 2, "webhook_processed_success_total": 1,
	} {
		got, err := testutil.GatherAndCount(env.App.Metrics.Registry, name)
		if err != nil || got != 1 {
			t.Fatalf("%s registered %d times: %v", name, got, err)
		}
		mfs, _ := env.App.Metrics.Registry.Gather()
		for _, mf := range mfs {
			if mf.GetName() == name && mf.GetMetric()[0].GetCounter().GetValue() != want {
				t.Fatalf("%s = %v, want %v", name, mf.GetMetric()[0].GetCounter().GetValue(), want)
			}
		}
	}
	mr := env.Do(env.Request(http.MethodGet, "/metrics", "", ""))
	text, _ := io.ReadAll(mr.Body)
	mr.Body.Close()
	for _, name := range []string{"webhook_events_received_total", "webhook_signature_failures_total", "webhook_invalid_payload_total",
		"webhook_persist_failures_total", "webhook_processed_success_total", "webhook_processing_failures_total", "payments_reconcile_failed_total"} {
		if !strings.Contains(string(text), "\n"+name+" ") {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

func readJSON[T any](t *testing.T, r *http.Response) T {
	t.Helper()
	defer r.Body.Close()
	var v T
	if err := json.NewDecoder(r.Body).Decode(&v); err != nil {
		t.Fatalf("decode %T: %v", v, err)
	}
	return v
}
