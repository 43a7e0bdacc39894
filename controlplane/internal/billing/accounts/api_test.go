package accounts_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing/invoices"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func want(t *testing.T, a apitest.Answer, status int, code, reason string) {
	t.Helper()
	if a.Status != status || (code != "" && a.Code() != code) || (reason != "" && a.Reason() != reason) {
		t.Fatalf("got %d %s/%s, want %d %s/%s: %s", a.Status, a.Code(), a.Reason(), status, code, reason, a.Raw)
	}
}

const accountsPath = "/api/v1/admin/billing/accounts"

func TestAccountsAPI(t *testing.T) {
	env := apitest.New(t)
	ctx := context.Background()
	_, root := env.PlatformAdmin(t)
	resellerT := env.NewTenant(t, root, "Reseller Ltd")
	customerT := env.NewTenant(t, root, "End Customer GmbH")
	plainT := env.NewTenant(t, root, "Plain Co")

	// Authorization comes before the body: a tenant admin gets admin_required even with a
	// body that would not validate, and nothing is written.
	a := env.Call(t, "POST", accountsPath, customerT.AdminToken, map[string]any{"bogus": 1}, "")
	want(t, a, 403, "admin_required", "")
	a = env.Call(t, "GET", accountsPath, customerT.AdminToken, nil, "")
	want(t, a, 403, "admin_required", "")

	// A reseller account.
	a = env.Call(t, "POST", accountsPath, root, map[string]any{
		"tenant_id": resellerT.ID, "account_type": "reseller", "name": "Reseller Ltd",
		"tax_profile": map[string]any{"treatment": "standard", "jurisdiction": "DE", "seller_tax_registration": "DE999999999",
			"tax_rates": []map[string]any{{"tax_category": "compute", "tax_rate_bps": 1900}}},
	}, "")
	want(t, a, 201, "", "")
	resellerAcct := a.Str("billing_account_id")
	if a.Str("account_type") != "reseller" || a.Str("credit_risk_owner") != "platform" || a.Str("parent_billing_account_id") != "" {
		t.Fatalf("reseller: %s", a.Raw)
	}
	// One account per tenant.
	a = env.Call(t, "POST", accountsPath, root, map[string]any{"tenant_id": resellerT.ID, "account_type": "tenant", "name": "x"}, "")
	want(t, a, 409, "invalid_request", "account_exists")

	// Bad input: nothing persisted.
	before := env.Count(t, `SELECT count(*) FROM billing_accounts`)
	bad := []struct {
		body         map[string]any
		status       int
		code, reason string
	}{
		{map[string]any{"tenant_id": customerT.ID, "account_type": "end_customer", "name": "EC"}, 422, "validation_error", "parent_required"},
		{map[string]any{"tenant_id": customerT.ID, "account_type": "tenant", "name": "EC", "parent_billing_account_id": resellerAcct}, 422, "validation_error", "parent_not_allowed"},
		{map[string]any{"tenant_id": customerT.ID, "account_type": "end_customer", "name": "EC", "parent_billing_account_id": resellerAcct,
			"tax_profile": map[string]any{"treatment": "reverse_charge", "tax_evidence": map[string]any{"vies": "ok"}}}, 422, "validation_error", "reverse_charge_requires_registration"},
		{map[string]any{"tenant_id": customerT.ID, "account_type": "end_customer", "name": "EC", "parent_billing_account_id": resellerAcct,
			"tax_profile": map[string]any{"treatment": "reverse_charge", "customer_tax_registration": "FR1"}}, 422, "validation_error", "reverse_charge_requires_evidence"},
		{map[string]any{"tenant_id": customerT.ID, "account_type": "end_customer", "name": "EC", "parent_billing_account_id": resellerAcct,
			"tax_profile": map[string]any{"treatment": "tax_exempt", "tax_evidence": map[string]any{"cert": "1"}}}, 422, "validation_error", "tax_exempt_requires_reason"},
		{map[string]any{"tenant_id": customerT.ID, "account_type": "tenant", "name": "EC",
			"tax_profile": map[string]any{"treatment": "standard", "jurisdiction": "DE", "tax_rates": []map[string]any{{"tax_category": "compute", "tax_rate_bps": 10001}}}}, 422, "validation_error", ""},
		{map[string]any{"tenant_id": customerT.ID, "account_type": "tenant", "name": "EC",
			"tax_profile": map[string]any{"treatment": "standard", "tax_rates": []map[string]any{{"tax_category": "compute", "tax_rate_bps": 10000}}}}, 422, "validation_error", "jurisdiction_required"},
		{map[string]any{"tenant_id": customerT.ID, "account_type": "tenant", "name": "EC", "credit_risk_owner": "reseller"}, 422, "validation_error", "no_reseller"},
		{map[string]any{"tenant_id": customerT.ID, "account_type": "end_customer", "name": "EC", "parent_billing_account_id": uuid.New()}, 404, "invalid_request", "not_found"},
		{map[string]any{"tenant_id": uuid.New(), "account_type": "tenant", "name": "EC"}, 404, "invalid_request", "not_found"},
		{map[string]any{"tenant_id": customerT.ID, "account_type": "tenant", "name": "EC", "customer_pricing_plan_id": uuid.New()}, 404, "invalid_request", "not_found"},
		{map[string]any{"tenant_id": customerT.ID, "account_type": "tenant", "name": "EC",
			"invoice_settings": map[string]any{"currency": "XYZ", "period": "monthly", "payment_terms_days": 30}}, 422, "validation_error", "unsupported_currency"},
		{map[string]any{"tenant_id": customerT.ID, "account_type": "tenant", "name": "EC",
			"invoice_settings": map[string]any{"currency": "USD", "period": "monthly", "payment_terms_days": 366}}, 400, "", ""},
	}
	for i, c := range bad {
		a := env.Call(t, "POST", accountsPath, root, c.body, "")
		if a.Status == 400 && c.status == 400 {
			continue
		}
		if c.status == 400 {
			want(t, a, 422, "validation_error", "")
			continue
		}
		if a.Status != c.status || a.Code() != c.code || (c.reason != "" && a.Reason() != c.reason) {
			t.Fatalf("case %d: got %d %s/%s, want %d %s/%s: %s", i, a.Status, a.Code(), a.Reason(), c.status, c.code, c.reason, a.Raw)
		}
	}
	if n := env.Count(t, `SELECT count(*) FROM billing_accounts`); n != before {
		t.Fatalf("refused creates persisted rows: %d -> %d", before, n)
	}

	// The end customer under the reseller: reseller carries the credit risk by default.
	plan := env.Call(t, "POST", "/api/v1/admin/billing/pricing-plans", root, map[string]any{"name": "wholesale",
		"prices": []map[string]any{{"usage_unit": "gpu.h100", "currency": "USD", "unit_price": "0.0005"}}}, "")
	want(t, plan, 201, "", "")
	a = env.Call(t, "POST", accountsPath, root, map[string]any{
		"tenant_id": customerT.ID, "account_type": "end_customer", "name": "End Customer GmbH", "parent_billing_account_id": resellerAcct,
		"wholesale_pricing_plan_id": plan.Str("id"),
		"tax_profile": map[string]any{"treatment": "reverse_charge", "customer_tax_registration": "FR12345678901",
			"tax_evidence": map[string]any{"vies_check": "2026-11-01"}},
		"invoice_settings": map[string]any{"currency": "USD", "period": "monthly", "payment_terms_days": 14},
	}, "")
	want(t, a, 201, "", "")
	ecAcct := a.Str("billing_account_id")
	if a.Str("reseller_tenant_id") != resellerT.ID.String() || a.Str("credit_risk_owner") != "reseller" ||
		a.Str("tax_responsibility") != "reseller" || a.Str("wholesale_pricing_plan_id") != plan.Str("id") {
		t.Fatalf("end customer: %s", a.Raw)
	}
	if n := env.Count(t, `SELECT count(*) FROM audit_events WHERE action = 'billing.account.create'`); n != 2 {
		t.Fatalf("audit rows: %d", n)
	}

	// The end customer sees its own account without the wholesale plan; the reseller sees
	// its own account, never the end customer's.
	me := env.Call(t, "GET", "/api/v1/billing/account", customerT.AdminToken, nil, "")
	want(t, me, 200, "", "")
	if me.Str("billing_account_id") != ecAcct || me.Body["wholesale_pricing_plan_id"] != nil || me.Str("account_type") != "end_customer" {
		t.Fatalf("end customer view: %s", me.Raw)
	}
	me = env.Call(t, "GET", "/api/v1/billing/account", resellerT.AdminToken, nil, "")
	if me.Str("billing_account_id") != resellerAcct {
		t.Fatalf("reseller view: %s", me.Raw)
	}
	me = env.Call(t, "GET", "/api/v1/billing/account", plainT.AdminToken, nil, "")
	want(t, me, 200, "", "")
	if me.Body["billing_account_id"] != nil || me.Str("account_type") != "tenant" || me.Str("name") != "Plain Co" {
		t.Fatalf("implicit account: %s", me.Raw)
	}

	// Invoice account: the reseller sells to its end customer under reverse charge.
	var ia invoices.Account
	err := pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
		var err error
		ia, err = env.App.Accounts.InvoiceAccount(ctx, tx, customerT.ID, "USD")
		return err
	})
	if err != nil || ia.SellerKey != "reseller:"+resellerT.ID.String() || ia.SellerName != "Reseller Ltd" || ia.PaymentTermsDays != 14 ||
		ia.Tax.Treatment != "reverse_charge" || *ia.Tax.CustomerRegistration != "FR12345678901" {
		t.Fatalf("invoice account: %+v %v", ia, err)
	}
	// Tax only where tax_responsibility says: standard tax on an invoice the reseller
	// issues while the platform is responsible gives no tax lines; the reseller's own
	// responsibility keeps them.
	std := map[string]any{"treatment": "standard", "jurisdiction": "FR", "tax_rates": []map[string]any{{"tax_category": "compute", "tax_rate_bps": 2000}}}
	a = env.Call(t, "PATCH", accountsPath+"/"+ecAcct, root, map[string]any{"tax_profile": std, "tax_responsibility": "platform"}, "")
	want(t, a, 200, "", "")
	err = pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
		var err error
		ia, err = env.App.Accounts.InvoiceAccount(ctx, tx, customerT.ID, "USD")
		return err
	})
	if err != nil || ia.Tax.Treatment != "not_configured" {
		t.Fatalf("platform responsible, reseller sells: %+v %v", ia.Tax, err)
	}
	a = env.Call(t, "PATCH", accountsPath+"/"+ecAcct, root, map[string]any{"tax_responsibility": "reseller"}, "")
	want(t, a, 200, "", "")
	err = pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
		var err error
		ia, err = env.App.Accounts.InvoiceAccount(ctx, tx, customerT.ID, "USD")
		return err
	})
	if err != nil || ia.Tax.Treatment != "standard" || ia.Tax.RateFor("compute") != 2000 {
		t.Fatalf("reseller responsible and selling: %+v %v", ia.Tax, err)
	}
	err = pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
		_, err := env.App.Accounts.InvoiceAccount(ctx, tx, customerT.ID, "EUR")
		return err
	})
	if err == nil {
		t.Fatal("an EUR invoice for a USD account was not refused")
	}

	// Disabling the reseller: its end customer cannot be invoiced, and a new end customer
	// under it is refused.
	a = env.Call(t, "PATCH", accountsPath+"/"+resellerAcct, root, map[string]any{"status": "disabled"}, "")
	want(t, a, 200, "", "")
	err = pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
		_, err := env.App.Accounts.InvoiceAccount(ctx, tx, customerT.ID, "USD")
		return err
	})
	if err == nil {
		t.Fatal("an end customer of a disabled reseller was invoiced")
	}
	a = env.Call(t, "POST", accountsPath, root, map[string]any{"tenant_id": plainT.ID, "account_type": "end_customer", "name": "P",
		"parent_billing_account_id": resellerAcct}, "")
	want(t, a, 409, "invalid_request", "reseller_not_active")
	a = env.Call(t, "PATCH", accountsPath+"/"+ecAcct, root, map[string]any{"status": "disabled"}, "")
	want(t, a, 200, "", "")
	a = env.Call(t, "PATCH", accountsPath+"/"+ecAcct, root, map[string]any{"status": "active"}, "")
	want(t, a, 409, "invalid_request", "reseller_not_active")
	a = env.Call(t, "PATCH", accountsPath+"/"+resellerAcct, root, map[string]any{"status": "active", "name": "Reseller Ltd."}, "")
	want(t, a, 200, "", "")
	if a.Str("name") != "Reseller Ltd." || a.Str("display_name") != "Reseller Ltd." {
		t.Fatalf("rename: %s", a.Raw)
	}
	a = env.Call(t, "PATCH", accountsPath+"/"+ecAcct, root, map[string]any{"status": "active"}, "")
	want(t, a, 200, "", "")
	// A change to an invalid profile is refused and changes nothing.
	a = env.Call(t, "PATCH", accountsPath+"/"+ecAcct, root, map[string]any{"tax_profile": map[string]any{"treatment": "tax_exempt"}}, "")
	want(t, a, 422, "validation_error", "tax_exempt_requires_evidence")
	a = env.Call(t, "GET", accountsPath+"/"+ecAcct, root, nil, "")
	if tp, _ := a.Body["tax_profile"].(map[string]any); tp["treatment"] != "standard" {
		t.Fatalf("refused patch changed the profile: %s", a.Raw)
	}
	a = env.Call(t, "PATCH", accountsPath+"/"+resellerAcct, root, map[string]any{"status": "deleted"}, "")
	want(t, a, 409, "invalid_request", "reseller_has_customers")
	a = env.Call(t, "GET", accountsPath+"/"+uuid.NewString(), root, nil, "")
	want(t, a, 404, "invalid_request", "not_found")

	// Pricing plan assignment creates the plain tenant's account.
	a = env.Call(t, "PUT", "/api/v1/admin/tenants/"+plainT.ID.String()+"/pricing-plan", customerT.AdminToken, map[string]any{"pricing_plan_id": plan.Str("id")}, "")
	want(t, a, 403, "admin_required", "")
	a = env.Call(t, "PUT", "/api/v1/admin/tenants/"+plainT.ID.String()+"/pricing-plan", root, map[string]any{"pricing_plan_id": uuid.NewString()}, "")
	want(t, a, 404, "invalid_request", "not_found")
	a = env.Call(t, "PUT", "/api/v1/admin/tenants/"+plainT.ID.String()+"/pricing-plan", root, map[string]any{"pricing_plan_id": plan.Str("id")}, "")
	want(t, a, 200, "", "")
	if a.Str("customer_pricing_plan_id") != plan.Str("id") || a.Str("account_type") != "tenant" {
		t.Fatalf("assign: %s", a.Raw)
	}
	a = env.Call(t, "PUT", "/api/v1/admin/tenants/"+plainT.ID.String()+"/pricing-plan", root, map[string]any{"pricing_plan_id": nil}, "")
	want(t, a, 200, "", "")
	if a.Body["customer_pricing_plan_id"] != nil {
		t.Fatalf("unassign: %s", a.Raw)
	}

	// List: filters and the cursor walk every account once.
	a = env.Call(t, "GET", accountsPath+"?reseller_tenant_id="+resellerT.ID.String(), root, nil, "")
	if items, _ := a.Body["items"].([]any); len(items) != 1 {
		t.Fatalf("reseller filter: %s", a.Raw)
	}
	seen := map[string]bool{}
	next := accountsPath + "?page_size=1"
	for next != "" {
		a = env.Call(t, "GET", next, root, nil, "")
		want(t, a, 200, "", "")
		for _, it := range a.Body["items"].([]any) {
			seen[it.(map[string]any)["billing_account_id"].(string)] = true
		}
		next = ""
		if p := a.Body["pagination"].(map[string]any); p["next_cursor"] != nil {
			next = accountsPath + "?page_size=1&cursor=" + p["next_cursor"].(string)
		}
	}
	if len(seen) != 3 {
		t.Fatalf("cursor walk saw %d accounts", len(seen))
	}
}
