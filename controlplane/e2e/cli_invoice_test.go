package e2e_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing/invoices"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

// TestCLIInvoices: a tenant's issued invoice through the built CLI: `invoice list` (a draft
// is not shown), `invoice get` with its lines, `invoice pdf` saved to a file whose text
// (pdftotext) carries the number and the total, a status filter, and a bad id as a usage
// error.
func TestCLIInvoices(t *testing.T) {
	env := apitest.New(t)
	ctx := context.Background()
	_, root := env.PlatformAdmin(t)
	acme := env.NewTenant(t, root, "Acme Invoices")
	jan, feb := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
	eff := jan.AddDate(-1, 0, 0)
	b := env.App.Billing
	if _, err := b.CreatePlan(ctx, "cli-invoices", true, &eff, []billing.PriceInput{{Unit: "gpu.h100", Currency: "USD", UnitPrice: "0.01"}}); err != nil {
		t.Fatal(err)
	}
	src := acme.DefaultProject
	if _, err := b.StartUsage(ctx, nil, billing.UsageStart{Source: billing.SourceAllocation, SourceID: src, TenantID: acme.ID,
		ProjectID: acme.DefaultProject, UserID: acme.AdminID, Unit: "gpu.h100", Quantity: 1, Currency: "USD", StartedAt: jan.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.StopUsage(ctx, nil, billing.SourceAllocation, src, jan.Add(time.Hour+4321*time.Second)); err != nil {
		t.Fatal(err)
	}
	closed, err := env.App.Invoices.Close(ctx, invoices.Period{TenantID: acme.ID, Currency: "USD", Start: jan, End: feb})
	if err != nil {
		t.Fatal(err)
	}
	id := closed.Invoice.ID.String()

	u := newCLIUser(t, env.Server.URL)
	if _, errOut, code := u.run(apitest.Password+"\n", "login", "-u", acme.AdminUsername, "--password-stdin"); code != 0 {
		t.Fatalf("login: exit %d\n%s", code, errOut)
	}
	if out := u.ok("invoice", "list", "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("a draft was listed: %s", out)
	}
	if issued := env.Call(t, "POST", "/api/v1/admin/billing/invoices/"+id+"/issue", root, nil, ""); issued.Status != 200 {
		t.Fatalf("issue: %d %s", issued.Status, issued.Raw)
	}

	var list []api.BillingInvoiceSummary
	if err := json.Unmarshal([]byte(u.ok("invoice", "list", "-o", "json")), &list); err != nil || len(list) != 1 || list[0].ID.String() != id ||
		list[0].Total.AmountMinor != 4321 || list[0].InvoiceNumber == nil {
		t.Fatalf("invoice list: %v %+v", err, list)
	}
	number := *list[0].InvoiceNumber
	if table := u.ok("invoice", "list"); !strings.Contains(table, number) || !strings.Contains(table, "2026-01-01..2026-02-01") || !strings.Contains(table, "43.21") {
		t.Fatalf("invoice list table:\n%s", table)
	}
	if out := u.ok("invoice", "list", "--status", "paid", "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("status filter: %s", out)
	}
	var detail api.BillingInvoiceDetail
	if err := json.Unmarshal([]byte(u.ok("invoice", "get", id, "-o", "json")), &detail); err != nil || len(detail.Lines) != 1 || detail.Lines[0].Amount.AmountMinor != 4321 {
		t.Fatalf("invoice get: %v %+v", err, detail)
	}
	if table := u.ok("invoice", "get", id); !strings.Contains(table, number) || !strings.Contains(table, "usage") {
		t.Fatalf("invoice get table:\n%s", table)
	}

	pdf := filepath.Join(u.home, "inv.pdf")
	u.ok("invoice", "pdf", id, "--out", pdf)
	raw, err := os.ReadFile(pdf)
	if err != nil || !strings.HasPrefix(string(raw), "%PDF-") {
		t.Fatalf("pdf file: %v %.20q", err, raw)
	}
	_, lookErr := exec.LookPath("pdftotext")
	ci.SkipUnlessAvailable(t, "pdftotext (Debian poppler-utils)", lookErr)
	text, err := exec.Command("pdftotext", pdf, "-").Output()
	if err != nil || !strings.Contains(string(text), number) || !strings.Contains(string(text), "43.21") {
		t.Fatalf("pdftotext: %v\n%s", err, text)
	}
	if _, errOut, code := u.run("", "invoice", "get", "not-an-id"); code != 2 || !strings.Contains(errOut, "invoice id") {
		t.Fatalf("bad id: exit %d\n%s", code, errOut)
	}
}
