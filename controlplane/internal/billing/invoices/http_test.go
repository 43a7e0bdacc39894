package invoices_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing/invoices"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

// Through the whole control plane (contract-validated responses): a tenant sees its
// issued invoice as JSON and as a PDF, never a draft or another tenant's; tenants are
// refused the admin operations (the chain audits denials, aggregated); admins list, issue and void.
func TestInvoicesOverHTTP(t *testing.T) {
	env := apitest.New(t)
	ctx := context.Background()
	_, root := env.PlatformAdmin(t)
	acme := env.NewTenant(t, root, "Acme")
	other := env.NewTenant(t, root, "Other")
	jan, feb := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
	eff := jan.AddDate(-1, 0, 0)
	b := env.App.Billing
	if _, err := b.CreatePlan(ctx, "http", true, &eff, []billing.PriceInput{{Unit: "gpu.h100", Currency: "USD", UnitPrice: "0.01"}}); err != nil {
		t.Fatal(err)
	}
	src := acme.DefaultProject // any uuid: the usage source id
	if _, err := b.StartUsage(ctx, nil, billing.UsageStart{Source: billing.SourceAllocation, SourceID: src, TenantID: acme.ID,
		ProjectID: acme.DefaultProject, UserID: acme.AdminID, Unit: "gpu.h100", Quantity: 1, Currency: "USD", StartedAt: jan.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.StopUsage(ctx, nil, billing.SourceAllocation, src, jan.Add(time.Hour+1234*time.Second)); err != nil {
		t.Fatal(err)
	}
	c, err := env.App.Invoices.Close(ctx, invoices.Period{TenantID: acme.ID, Currency: "USD", Start: jan, End: feb})
	if err != nil {
		t.Fatal(err)
	}
	id := c.Invoice.ID.String()

	list := env.Call(t, "GET", "/api/v1/billing/invoices", acme.AdminToken, nil, "")
	if list.Status != 200 || len(list.Body["items"].([]any)) != 0 {
		t.Fatalf("tenant list with a draft: %d %s", list.Status, list.Raw)
	}
	if a := env.Call(t, "GET", "/api/v1/billing/invoices/"+id, acme.AdminToken, nil, ""); a.Status != 404 {
		t.Fatalf("draft detail: %d %s", a.Status, a.Raw)
	}
	if a := env.Call(t, "POST", "/api/v1/admin/billing/invoices/"+id+"/issue", acme.AdminToken, nil, ""); a.Status != 403 {
		t.Fatalf("tenant issue: %d %s", a.Status, a.Raw)
	}
	adminList := env.Call(t, "GET", "/api/v1/admin/billing/invoices?org_id="+acme.ID.String(), root, nil, "")
	if adminList.Status != 200 || len(adminList.Body["items"].([]any)) != 1 {
		t.Fatalf("admin list: %d %s", adminList.Status, adminList.Raw)
	}
	issued := env.Call(t, "POST", "/api/v1/admin/billing/invoices/"+id+"/issue", root, nil, "")
	if issued.Status != 200 || issued.Str("status") != "due" || issued.Str("invoice_number") != "GNT-000001" {
		t.Fatalf("issue: %d %s", issued.Status, issued.Raw)
	}
	again := env.Call(t, "POST", "/api/v1/admin/billing/invoices/"+id+"/issue", root, nil, "")
	if again.Status != 409 || again.Reason() != "invoice_state_invalid" {
		t.Fatalf("second issue: %d %s", again.Status, again.Raw)
	}
	detail := env.Call(t, "GET", "/api/v1/billing/invoices/"+id, acme.AdminToken, nil, "")
	if detail.Status != 200 || len(detail.Body["lines"].([]any)) != 1 {
		t.Fatalf("detail: %d %s", detail.Status, detail.Raw)
	}
	if total := detail.Body["total"].(map[string]any)["amount_minor"].(float64); total != 1234 {
		t.Fatalf("total %v", total)
	}
	if a := env.Call(t, "GET", "/api/v1/billing/invoices/"+id, other.AdminToken, nil, ""); a.Status != 404 {
		t.Fatalf("other tenant: %d %s", a.Status, a.Raw)
	}

	// The PDF through the chain.
	req := env.Request("GET", "/api/v1/billing/invoices/"+id, acme.AdminToken, "")
	req.Header.Set("Accept", "application/pdf")
	resp := env.Do(req)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/pdf" || !strings.HasPrefix(string(raw), "%PDF-") {
		t.Fatalf("pdf: %d %s %.200q", resp.StatusCode, resp.Header.Get("Content-Type"), raw)
	}
	bin, err := exec.LookPath("pdftotext")
	ci.SkipUnlessAvailable(t, "pdftotext (poppler-utils)", err)
	in := filepath.Join(t.TempDir(), "inv.pdf")
	if err := os.WriteFile(in, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-layout", in, "-").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Invoice GNT-000001", "Acme", "Total", "12.34 USD", "Amount due"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("PDF lacks %q:\n%s", want, out)
		}
	}

	// Void needs a reason (the contract), and this invoice had no prepaid part.
	if a := env.Call(t, "POST", "/api/v1/admin/billing/invoices/"+id+"/void", root, map[string]any{}, ""); a.Status == 200 {
		t.Fatalf("void without reason: %d %s", a.Status, a.Raw)
	}
	v := env.Call(t, "POST", "/api/v1/admin/billing/invoices/"+id+"/void", root, map[string]any{"reason": "duplicate"}, "")
	if v.Status != 200 || v.Str("status") != "void" {
		t.Fatalf("void: %d %s", v.Status, v.Raw)
	}
	if n := env.Count(t, `SELECT count(*) FROM audit_events WHERE action IN ('billing.invoice.issue', 'billing.invoice.void') AND result = 'success'`); n != 2 {
		t.Fatalf("%d admin audits", n)
	}
	if env.Validated.Load() == 0 {
		t.Fatal("no response was checked against the contract")
	}
}
