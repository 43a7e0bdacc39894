package accounts_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing/invoices"
)

// From accounts to invoices: an end customer's usage, rated for both sides, closes into
// the end customer's invoice sold by its reseller (customer prices, reverse charge) and
// the reseller's invoice sold by the platform (wholesale prices, prepaid by the
// reseller's wallet, standard tax).
func TestResellerUsageInvoicedOnBothSides(t *testing.T) {
	env := apitest.New(t)
	ctx := context.Background()
	_, root := env.PlatformAdmin(t)
	resellerT := env.NewTenant(t, root, "Reseller Ltd")
	customerT := env.NewTenant(t, root, "End Customer GmbH")

	eff := "2026-01-01T00:00:00Z"
	std := env.Call(t, "POST", "/api/v1/admin/billing/pricing-plans", root, map[string]any{"name": "list", "is_default": true,
		"effective_from": eff, "prices": []map[string]any{{"usage_unit": "gpu.h100", "currency": "USD", "unit_price": "0.000694444444"}}}, "")
	want(t, std, 201, "", "")
	ws := env.Call(t, "POST", "/api/v1/admin/billing/pricing-plans", root, map[string]any{"name": "wholesale",
		"effective_from": eff, "prices": []map[string]any{{"usage_unit": "gpu.h100", "currency": "USD", "unit_price": "0.0005"}}}, "")
	want(t, ws, 201, "", "")
	ra := env.Call(t, "POST", accountsPath, root, map[string]any{"tenant_id": resellerT.ID, "account_type": "reseller", "name": "Reseller Ltd",
		"tax_profile": map[string]any{"treatment": "standard", "jurisdiction": "DE", "default_tax_rate_bps": 1900}}, "")
	want(t, ra, 201, "", "")
	ec := env.Call(t, "POST", accountsPath, root, map[string]any{"tenant_id": customerT.ID, "account_type": "end_customer",
		"name": "End Customer GmbH", "parent_billing_account_id": ra.Str("billing_account_id"), "wholesale_pricing_plan_id": ws.Str("id"),
		"tax_profile": map[string]any{"treatment": "reverse_charge", "customer_tax_registration": "FR12345678901",
			"tax_evidence": map[string]any{"vies_check": "ok"}}}, "")
	want(t, ec, 201, "", "")
	if _, err := env.App.Billing.Adjust(ctx, billing.Adjustment{TenantID: resellerT.ID, Money: billing.Money{AmountMinor: 10000, Currency: "USD"}, Reason: "float"}); err != nil {
		t.Fatal(err)
	}

	from := time.Date(2026, 10, 5, 10, 0, 0, 0, time.UTC)
	src := uuid.New()
	if _, err := env.App.Billing.StartUsage(ctx, nil, billing.UsageStart{Source: billing.SourceAllocation, SourceID: src, TenantID: customerT.ID,
		ProjectID: customerT.DefaultProject, UserID: customerT.AdminID, Unit: "gpu.h100", Quantity: 1, StartedAt: from}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.App.Billing.StopUsage(ctx, nil, billing.SourceAllocation, src, from.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}

	start, end := invoices.MonthOf(from)
	cust, err := env.App.Invoices.Close(ctx, invoices.Period{TenantID: customerT.ID, Currency: "USD", Start: start, End: end})
	if err != nil {
		t.Fatal(err)
	}
	ci := cust.Invoice
	if ci.SellerKey != "reseller:"+resellerT.ID.String() || ci.SellerName != "Reseller Ltd" || ci.TaxTreatment != "reverse_charge" ||
		ci.Totals.Total != 250 || ci.Totals.Tax != 0 || ci.Totals.Prepaid != 0 {
		t.Fatalf("end customer invoice: %+v", ci)
	}
	res, err := env.App.Invoices.Close(ctx, invoices.Period{TenantID: resellerT.ID, Currency: "USD", Start: start, End: end})
	if err != nil {
		t.Fatal(err)
	}
	ri := res.Invoice
	// 180 wholesale + 19% = 34.2 -> 34 tax; the wallet paid the 180 when it was rated.
	if ri.SellerKey != invoices.PlatformSeller || ri.TaxTreatment != "standard" || ri.Totals.Subtotal != 180 || ri.Totals.Tax != 34 ||
		ri.Totals.Prepaid != 180 {
		t.Fatalf("reseller invoice: %+v", ri)
	}

	// Through the real server (contract-validated): drafts are not shown to tenants; the
	// admin issues; each tenant sees only its own invoice, as JSON and as PDF.
	list := env.Call(t, "GET", "/api/v1/billing/invoices", customerT.AdminToken, nil, "")
	want(t, list, 200, "", "")
	if items := list.Body["items"].([]any); len(items) != 0 {
		t.Fatalf("a draft is shown to the tenant: %s", list.Raw)
	}
	iss := env.Call(t, "POST", "/api/v1/admin/billing/invoices/"+ci.ID.String()+"/issue", customerT.AdminToken, nil, "")
	want(t, iss, 403, "admin_required", "")
	iss = env.Call(t, "POST", "/api/v1/admin/billing/invoices/"+ci.ID.String()+"/issue", root, nil, "")
	want(t, iss, 200, "", "")
	if iss.Str("status") != "due" || iss.Str("invoice_number") == "" {
		t.Fatalf("issued: %s", iss.Raw)
	}
	list = env.Call(t, "GET", "/api/v1/billing/invoices?status=due", customerT.AdminToken, nil, "")
	if items := list.Body["items"].([]any); len(items) != 1 || items[0].(map[string]any)["id"] != ci.ID.String() {
		t.Fatalf("tenant list: %s", list.Raw)
	}
	got := env.Call(t, "GET", "/api/v1/billing/invoices/"+ci.ID.String(), resellerT.AdminToken, nil, "")
	if got.Status != 404 {
		t.Fatalf("the reseller sees its end customer's invoice: %d %s", got.Status, got.Raw)
	}
	req := env.Request("GET", "/api/v1/billing/invoices/"+ci.ID.String(), customerT.AdminToken, "")
	req.Header.Set("Accept", "application/pdf")
	resp := env.Do(req)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/pdf" || !strings.HasPrefix(string(body), "%PDF-") {
		t.Fatalf("PDF: %d %s %.40q", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
}

// The admin view shows what a tenant owes; an admin credit settles it before the
// balance grows, and the launch check refuses while it is owed.
func TestAdminViewShowsArrears(t *testing.T) {
	env := apitest.New(t)
	ctx := context.Background()
	_, root := env.PlatformAdmin(t)
	tn := env.NewTenant(t, root, "Owes Co")
	plan := env.Call(t, "POST", "/api/v1/admin/billing/pricing-plans", root, map[string]any{"name": "list", "is_default": true,
		"effective_from": "2026-01-01T00:00:00Z", "prices": []map[string]any{{"usage_unit": "gpu.h100", "currency": "USD", "unit_price": "0.000694444444"}}}, "")
	want(t, plan, 201, "", "")
	acct := env.Call(t, "PUT", "/api/v1/admin/tenants/"+tn.ID.String()+"/pricing-plan", root, map[string]any{"pricing_plan_id": plan.Str("id")}, "")
	want(t, acct, 200, "", "")
	from := time.Date(2026, 10, 5, 10, 0, 0, 0, time.UTC)
	src := uuid.New()
	if _, err := env.App.Billing.StartUsage(ctx, nil, billing.UsageStart{Source: billing.SourceAllocation, SourceID: src, TenantID: tn.ID,
		ProjectID: tn.DefaultProject, UserID: tn.AdminID, Unit: "gpu.h100", Quantity: 1, StartedAt: from}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.App.Billing.StopUsage(ctx, nil, billing.SourceAllocation, src, from.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	a := env.Call(t, "GET", accountsPath+"/"+acct.Str("billing_account_id"), root, nil, "")
	arrears, _ := a.Body["arrears"].([]any)
	if len(arrears) != 1 || arrears[0].(map[string]any)["amount_minor"] != float64(250) {
		t.Fatalf("arrears: %s", a.Raw)
	}
	d, err := env.App.Billing.CanLaunch(ctx, tn.ID, tn.DefaultProject, "gpu.h100", 1, "")
	if err != nil || d.Allowed || d.Arrears != 250 {
		t.Fatalf("launch decision: %+v %v", d, err)
	}
	credit := env.Call(t, "POST", "/api/v1/admin/billing/adjustments", root, map[string]any{"tenant_id": tn.ID,
		"amount": map[string]any{"amount_minor": 300, "currency": "USD"}, "reason": "settle"}, "")
	want(t, credit, 201, "", "")
	if b := credit.Body["balance"].(map[string]any); b["amount_minor"] != float64(50) {
		t.Fatalf("the credit grew the balance before settling: %s", credit.Raw)
	}
	a = env.Call(t, "GET", accountsPath+"/"+acct.Str("billing_account_id"), root, nil, "")
	if arrears, _ := a.Body["arrears"].([]any); len(arrears) != 0 {
		t.Fatalf("arrears after the credit: %s", a.Raw)
	}
}

// Under platform credit risk the end customer's own wallet pays at customer prices and
// the wholesale line is only the reseller's cost statement (no ledger entry): closing the
// reseller's period must not invoice it.
func TestPlatformRiskWholesaleIsNotInvoicedToTheReseller(t *testing.T) {
	env := apitest.New(t)
	ctx := context.Background()
	_, root := env.PlatformAdmin(t)
	resellerT := env.NewTenant(t, root, "Reseller Two")
	customerT := env.NewTenant(t, root, "Customer Two")
	eff := "2026-01-01T00:00:00Z"
	want(t, env.Call(t, "POST", "/api/v1/admin/billing/pricing-plans", root, map[string]any{"name": "list", "is_default": true,
		"effective_from": eff, "prices": []map[string]any{{"usage_unit": "gpu.h100", "currency": "USD", "unit_price": "0.000694444444"}}}, ""), 201, "", "")
	ws := env.Call(t, "POST", "/api/v1/admin/billing/pricing-plans", root, map[string]any{"name": "wholesale",
		"effective_from": eff, "prices": []map[string]any{{"usage_unit": "gpu.h100", "currency": "USD", "unit_price": "0.0005"}}}, "")
	want(t, ws, 201, "", "")
	ra := env.Call(t, "POST", accountsPath, root, map[string]any{"tenant_id": resellerT.ID, "account_type": "reseller", "name": "Reseller Two",
		"tax_profile": map[string]any{"treatment": "standard", "jurisdiction": "DE", "default_tax_rate_bps": 1900}}, "")
	want(t, ra, 201, "", "")
	want(t, env.Call(t, "POST", accountsPath, root, map[string]any{"tenant_id": customerT.ID, "account_type": "end_customer",
		"name": "Customer Two", "parent_billing_account_id": ra.Str("billing_account_id"), "wholesale_pricing_plan_id": ws.Str("id"),
		"credit_risk_owner": "platform", "tax_profile": map[string]any{"treatment": "not_configured"}}, ""), 201, "", "")
	if _, err := env.App.Billing.Adjust(ctx, billing.Adjustment{TenantID: customerT.ID, Money: billing.Money{AmountMinor: 10000, Currency: "USD"}, Reason: "own wallet"}); err != nil {
		t.Fatal(err)
	}
	from := time.Date(2026, 10, 5, 10, 0, 0, 0, time.UTC)
	src := uuid.New()
	if _, err := env.App.Billing.StartUsage(ctx, nil, billing.UsageStart{Source: billing.SourceAllocation, SourceID: src, TenantID: customerT.ID,
		ProjectID: customerT.DefaultProject, UserID: customerT.AdminID, Unit: "gpu.h100", Quantity: 1, StartedAt: from}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.App.Billing.StopUsage(ctx, nil, billing.SourceAllocation, src, from.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	// Both sides were rated: the customer line with its ledger entry, the wholesale one without.
	if n := env.Count(t, `SELECT count(*) FROM billing_rated_usage_lines WHERE rating_role = 'wholesale' AND ledger_entry_id IS NULL`); n != 1 {
		t.Fatalf("%d wholesale statement lines, want 1", n)
	}
	start, end := invoices.MonthOf(from)
	cust, err := env.App.Invoices.Close(ctx, invoices.Period{TenantID: customerT.ID, Currency: "USD", Start: start, End: end})
	if err != nil {
		t.Fatal(err)
	}
	if cust.Invoice.Totals.Subtotal != 250 || cust.Invoice.Totals.Prepaid != 250 {
		t.Fatalf("end customer invoice: %+v", cust.Invoice)
	}
	res, err := env.App.Invoices.Close(ctx, invoices.Period{TenantID: resellerT.ID, Currency: "USD", Start: start, End: end})
	if err != nil {
		t.Fatal(err)
	}
	if res.Invoice.Totals.Subtotal != 0 || res.Invoice.Totals.Total != 0 {
		t.Fatalf("the reseller was invoiced the platform-risk wholesale statement: %+v", res.Invoice)
	}
}
