package billing_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/proto/api"
)

func wantErr(t *testing.T, status int, body []byte, got int, code, reason string) {
	t.Helper()
	var e api.ErrorResponse
	_ = json.Unmarshal(body, &e)
	if got != status || string(e.Code) != code || (reason != "" && e.Details["reason"] != reason) {
		t.Fatalf("got %d %s/%v, want %d %s/%s: %s", got, e.Code, e.Details["reason"], status, code, reason, body)
	}
}

func TestAPIBillingBalancesAdjustmentsFXAndPlans(t *testing.T) {
	env := apitest.New(t)
	ctx := context.Background()
	_, root := env.PlatformAdmin(t)
	acme := env.NewTenant(t, root, "Acme")
	admin, alice := env.Client(root), env.Client(acme.AdminToken)

	bal, err := alice.GetBillingBalanceWithResponse(ctx, &api.GetBillingBalanceParams{})
	if err != nil {
		t.Fatal(err)
	}
	if bal.StatusCode() != 200 || bal.JSON200.Balance != (api.Money{AmountMinor: 0, Currency: "USD"}) || len(bal.JSON200.Balances) != 1 {
		t.Fatalf("empty balance: %d %s", bal.StatusCode(), bal.Body)
	}

	adj := func(c *api.ClientWithResponses, key string, m api.Money) *api.CreateBillingAdjustmentHTTPResponse {
		t.Helper()
		p := &api.CreateBillingAdjustmentParams{}
		if key != "" {
			p.IdempotencyKey = &key
		}
		r, err := c.CreateBillingAdjustmentWithResponse(ctx, p, api.BillingAdjustmentRequest{TenantID: acme.ID, Amount: m, Reason: "welcome credit"})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := adj(alice, "", api.Money{AmountMinor: 5000, Currency: "USD"})
	wantErr(t, 403, r.Body, r.StatusCode(), "admin_required", "")
	r = adj(admin, "credit-1", api.Money{AmountMinor: 5000, Currency: "USD"})
	if r.StatusCode() != 201 || r.JSON201.Balance.AmountMinor != 5000 {
		t.Fatalf("credit: %d %s", r.StatusCode(), r.Body)
	}
	first := r.JSON201.LedgerTransactionID
	r = adj(admin, "credit-1", api.Money{AmountMinor: 5000, Currency: "USD"})
	if r.StatusCode() != 201 || r.JSON201.LedgerTransactionID != first {
		t.Fatalf("replay: %d %s", r.StatusCode(), r.Body)
	}
	r = adj(admin, "", api.Money{AmountMinor: -6000, Currency: "USD"})
	wantErr(t, 402, r.Body, r.StatusCode(), "insufficient_balance", "")
	r = adj(admin, "", api.Money{AmountMinor: 1, Currency: "XYZ"})
	wantErr(t, 422, r.Body, r.StatusCode(), "validation_error", "unsupported_currency")
	if r = adj(admin, "", api.Money{AmountMinor: 300, Currency: "EUR"}); r.StatusCode() != 201 {
		t.Fatalf("EUR credit: %d %s", r.StatusCode(), r.Body)
	}
	bal, _ = alice.GetBillingBalanceWithResponse(ctx, &api.GetBillingBalanceParams{})
	if bal.JSON200.Balance != (api.Money{AmountMinor: 5000, Currency: "USD"}) || len(bal.JSON200.Balances) != 2 ||
		bal.JSON200.Balances[0] != (api.Money{AmountMinor: 300, Currency: "EUR"}) {
		t.Fatalf("two currencies: %s", bal.Body)
	}
	me, _ := alice.GetMeWithResponse(ctx, &api.GetMeParams{})
	if me.JSON200 == nil || me.JSON200.Balance != (api.Money{AmountMinor: 5000, Currency: "USD"}) {
		t.Fatalf("/me balance: %s", me.Body)
	}

	// Reversal of the USD credit, once.
	rv, err := admin.ReverseBillingLedgerTransactionWithResponse(ctx, first, &api.ReverseBillingLedgerTransactionParams{}, api.BillingLedgerReversalRequest{Reason: "test"})
	if err != nil || rv.StatusCode() != 201 {
		t.Fatalf("reversal: %v %s", err, rv.Body)
	}
	rv, _ = admin.ReverseBillingLedgerTransactionWithResponse(ctx, rv.JSON201.ReversalTransactionID, &api.ReverseBillingLedgerTransactionParams{}, api.BillingLedgerReversalRequest{Reason: "test"})
	wantErr(t, 409, rv.Body, rv.StatusCode(), "invalid_request", "is_reversal")
	rv, _ = admin.ReverseBillingLedgerTransactionWithResponse(ctx, uuid.New(), &api.ReverseBillingLedgerTransactionParams{}, api.BillingLedgerReversalRequest{Reason: "test"})
	wantErr(t, 404, rv.Body, rv.StatusCode(), "invalid_request", "not_found")

	// Currency settings and FX evidence.
	cs, _ := alice.GetBillingCurrencySettingsWithResponse(ctx, &api.GetBillingCurrencySettingsParams{})
	if cs.StatusCode() != 200 || cs.JSON200.DefaultCurrency != "USD" || cs.JSON200.FxSnapshot != nil || len(cs.JSON200.SupportedCurrencies) != 2 {
		t.Fatalf("settings: %s", cs.Body)
	}
	put := func(rate string) (int, []byte) {
		body := fmt.Sprintf(`{"source_currency":"USD","target_currency":"EUR","rate":%q,"provider":"ecb","provider_rate_id":null,"captured_at":"2026-05-01T00:00:00Z"}`, rate)
		resp := env.Do(env.Request("PUT", "/api/v1/admin/billing/fx-snapshots", root, body))
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	for _, bad := range []string{"0", "0.00", "-1", "abc", "1e3", ""} {
		code, body := put(bad)
		wantErr(t, 422, body, code, "validation_error", "")
	}
	if code, body := put("0.9213"); code != 201 {
		t.Fatalf("fx: %d %s", code, body)
	}
	if code, body := put("0.9213"); code != 200 {
		t.Fatalf("fx again: %d %s", code, body)
	}
	code, body := put("0.95")
	wantErr(t, 409, body, code, "invalid_request", "fx_snapshot_conflict")
	resp := env.Do(env.Request("PUT", "/api/v1/admin/billing/fx-snapshots", acme.AdminToken,
		`{"source_currency":"USD","target_currency":"EUR","rate":"1","provider":"ecb","provider_rate_id":null,"captured_at":"2026-05-01T00:00:00Z"}`))
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Fatalf("non-admin fx: %d", resp.StatusCode)
	}
	cs, _ = alice.GetBillingCurrencySettingsWithResponse(ctx, &api.GetBillingCurrencySettingsParams{})
	if cs.JSON200.FxSnapshot == nil || cs.JSON200.FxSnapshot.Rate != "0.9213" {
		t.Fatalf("settings with fx: %s", cs.Body)
	}

	acct, _ := alice.GetBillingAccountWithResponse(ctx, &api.GetBillingAccountParams{})
	if acct.StatusCode() != 200 || acct.JSON200.AccountType != "tenant" || acct.JSON200.BillingAccountID != nil || acct.JSON200.ResellerTenantID != nil {
		t.Fatalf("account: %s", acct.Body)
	}

	// Pricing plans.
	pc, _ := admin.CreateBillingPricingPlanWithResponse(ctx, &api.CreateBillingPricingPlanParams{}, api.BillingPricingPlanCreateRequest{
		Name: "standard", IsDefault: ptr(true), Prices: []api.BillingPrice{{UsageUnit: "gpu.h100", Currency: "USD", UnitPrice: "0.000694444444"}},
	})
	if pc.StatusCode() != 201 || len(pc.JSON201.Versions) != 1 {
		t.Fatalf("plan: %d %s", pc.StatusCode(), pc.Body)
	}
	pc2, _ := admin.CreateBillingPricingPlanWithResponse(ctx, &api.CreateBillingPricingPlanParams{}, api.BillingPricingPlanCreateRequest{
		Name: "standard", Prices: []api.BillingPrice{{UsageUnit: "gpu.h100", Currency: "USD", UnitPrice: "1"}},
	})
	wantErr(t, 409, pc2.Body, pc2.StatusCode(), "invalid_request", "duplicate_name")
	past := time.Now().Add(-time.Hour)
	pv, _ := admin.CreateBillingPricingPlanVersionWithResponse(ctx, pc.JSON201.ID, &api.CreateBillingPricingPlanVersionParams{},
		api.BillingPricingPlanVersionCreateRequest{EffectiveFrom: &past, Prices: []api.BillingPrice{{UsageUnit: "gpu.h100", Currency: "USD", UnitPrice: "0.0008"}}})
	wantErr(t, 422, pv.Body, pv.StatusCode(), "validation_error", "in_past")
	future := time.Now().Add(time.Hour)
	pv, _ = admin.CreateBillingPricingPlanVersionWithResponse(ctx, pc.JSON201.ID, &api.CreateBillingPricingPlanVersionParams{},
		api.BillingPricingPlanVersionCreateRequest{EffectiveFrom: &future, Prices: []api.BillingPrice{{UsageUnit: "gpu.h100", Currency: "USD", UnitPrice: "0.0008"}}})
	if pv.StatusCode() != 201 || len(pv.JSON201.Versions) != 2 {
		t.Fatalf("version: %d %s", pv.StatusCode(), pv.Body)
	}
	pl, _ := admin.ListBillingPricingPlansWithResponse(ctx, &api.ListBillingPricingPlansParams{})
	if pl.StatusCode() != 200 || len(pl.JSON200.Items) != 1 {
		t.Fatalf("plans: %s", pl.Body)
	}
	pl, _ = alice.ListBillingPricingPlansWithResponse(ctx, &api.ListBillingPricingPlansParams{})
	wantErr(t, 403, pl.Body, pl.StatusCode(), "admin_required", "")
}

func ptr[T any](v T) *T { return &v }

func TestAPIBillingUsageListAndShadowRating(t *testing.T) {
	env := apitest.New(t)
	ctx := context.Background()
	_, root := env.PlatformAdmin(t)
	acme := env.NewTenant(t, root, "Acme")
	admin, alice := env.Client(root), env.Client(acme.AdminToken)
	svc := env.App.Billing
	eff := time.Now().Add(-48 * time.Hour)
	if _, err := svc.CreatePlan(ctx, "standard", true, &eff, []billing.PriceInput{{Unit: "gpu.h100", Currency: "USD", UnitPrice: "0.01"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Adjust(ctx, billing.Adjustment{TenantID: acme.ID, Money: billing.Money{AmountMinor: 10_000_000, Currency: "USD"}, Reason: "t"}); err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	base := time.Now().Add(-24 * time.Hour).Truncate(time.Second)
	for i := range 5 {
		rec, err := svc.StartUsage(ctx, nil, billing.UsageStart{Source: billing.SourceAllocation, SourceID: uuid.New(), TenantID: acme.ID,
			ProjectID: acme.DefaultProject, UserID: acme.AdminID, Unit: "gpu.h100", Quantity: int64(1 + i%3), StartedAt: base.Add(time.Duration(i) * time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := svc.StopUsage(ctx, nil, billing.SourceAllocation, rec.SourceID, rec.BillFrom.Add(time.Duration(10+7*i)*time.Second)); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, rec.ID)
	}
	collect := func(sort api.BillingUsageSortOrder) []api.BillingRatedUsageLine {
		var out []api.BillingRatedUsageLine
		var cursor *string
		for {
			size := 2
			r, err := alice.ListBillingUsageWithResponse(ctx, &api.ListBillingUsageParams{Sort: &sort, Cursor: cursor, PageSize: &size})
			if err != nil || r.StatusCode() != 200 {
				t.Fatalf("list %s: %v %s", sort, err, r.Body)
			}
			out = append(out, r.JSON200.Items...)
			if r.JSON200.Pagination.NextCursor == nil {
				return out
			}
			cursor = r.JSON200.Pagination.NextCursor
		}
	}
	for _, sort := range []api.BillingUsageSortOrder{api.BillingUsageSortOrderStartTimeDesc, api.BillingUsageSortOrderStartTimeAsc,
		api.BillingUsageSortOrderCostDesc, api.BillingUsageSortOrderCostAsc} {
		items := collect(sort)
		if len(items) != 5 {
			t.Fatalf("%s: %d items", sort, len(items))
		}
		for i := 1; i < len(items); i++ {
			a, b := items[i-1], items[i]
			var ok bool
			switch sort {
			case api.BillingUsageSortOrderStartTimeDesc:
				ok = !a.BillFrom.Before(b.BillFrom)
			case api.BillingUsageSortOrderStartTimeAsc:
				ok = !a.BillFrom.After(b.BillFrom)
			case api.BillingUsageSortOrderCostDesc:
				ok = a.Amount.AmountMinor >= b.Amount.AmountMinor
			default:
				ok = a.Amount.AmountMinor <= b.Amount.AmountMinor
			}
			if !ok {
				t.Fatalf("%s out of order at %d", sort, i)
			}
		}
	}
	size, asc, desc := 2, api.BillingUsageSortOrderStartTimeAsc, api.BillingUsageSortOrderCostDesc
	r, _ := alice.ListBillingUsageWithResponse(ctx, &api.ListBillingUsageParams{Sort: &asc, PageSize: &size})
	r2, _ := alice.ListBillingUsageWithResponse(ctx, &api.ListBillingUsageParams{Sort: &desc, Cursor: r.JSON200.Pagination.NextCursor})
	wantErr(t, 400, r2.Body, r2.StatusCode(), "invalid_request", "")
	from, to := base.Add(90*time.Second), base.Add(10*time.Minute)
	r, _ = alice.ListBillingUsageWithResponse(ctx, &api.ListBillingUsageParams{From: &from, To: &to})
	if len(r.JSON200.Items) != 3 {
		t.Fatalf("from/to: %d items", len(r.JSON200.Items))
	}
	// Another tenant sees nothing of Acme's.
	other := env.NewTenant(t, root, "Other")
	r, _ = env.Client(other.AdminToken).ListBillingUsageWithResponse(ctx, &api.ListBillingUsageParams{})
	if len(r.JSON200.Items) != 0 {
		t.Fatal("cross-tenant usage")
	}

	shadow := func(c *api.ClientWithResponses, ids []uuid.UUID, price int64) *api.ShadowRateBillingHTTPResponse {
		t.Helper()
		r, err := c.ShadowRateBillingWithResponse(ctx, &api.ShadowRateBillingParams{}, api.BillingShadowRatingRequest{
			OrgID: acme.ID, UsageRecordIds: ids, CandidateUnitPrice: api.Money{AmountMinor: price, Currency: "USD"}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	sr := shadow(admin, ids, 1)
	if sr.StatusCode() != 200 || sr.JSON200.LedgerWrites || sr.JSON200.RatedUsageWrites || sr.JSON200.Totals.DeltaAmount.AmountMinor != 0 ||
		len(sr.JSON200.Lines) != 5 || sr.JSON200.Totals.ExistingRatedAmount.AmountMinor == 0 || sr.JSON200.Lines[0].PricingSource != "shadow_rating" {
		t.Fatalf("shadow: %d %s", sr.StatusCode(), sr.Body)
	}
	sr = shadow(alice, ids, 1)
	wantErr(t, 403, sr.Body, sr.StatusCode(), "admin_required", "")
	sr = shadow(admin, []uuid.UUID{}, 1)
	wantErr(t, 422, sr.Body, sr.StatusCode(), "validation_error", "")
	many := make([]uuid.UUID, 101)
	for i := range many {
		many[i] = uuid.New()
	}
	sr = shadow(admin, many, 1)
	wantErr(t, 422, sr.Body, sr.StatusCode(), "validation_error", "")
	sr = shadow(admin, many[:100], 1)
	wantErr(t, 404, sr.Body, sr.StatusCode(), "invalid_request", "not_found")
}
