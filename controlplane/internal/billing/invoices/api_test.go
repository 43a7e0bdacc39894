package invoices_test

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing/invoices"
	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

func member(tenant uuid.UUID) context.Context {
	return principal.With(context.Background(), &principal.Principal{UserID: uuid.New(), Username: "m", TenantID: tenant, TenantRole: principal.TenantRoleMember})
}

func admin() context.Context {
	return principal.With(context.Background(), &principal.Principal{UserID: uuid.New(), Username: "root", Capabilities: []string{principal.CapAdmin}})
}

// pdfText renders the invoice through the handler (Accept: application/pdf) and reads
// its text back with pdftotext.
func pdfText(t *testing.T, h *invoices.Handlers, ctx context.Context, id uuid.UUID) string {
	t.Helper()
	bin, err := exec.LookPath("pdftotext")
	ci.SkipUnlessAvailable(t, "pdftotext (poppler-utils)", err)
	res, err := h.GetBillingInvoice(invoices.WithAccept(ctx, "application/pdf"), api.GetBillingInvoiceRequestObject{InvoiceID: id})
	if err != nil {
		t.Fatal(err)
	}
	doc, ok := res.(api.GetBillingInvoice200ApplicationPdfResponse)
	if !ok {
		t.Fatalf("got %T, want the PDF", res)
	}
	raw, err := io.ReadAll(doc.Body)
	if err != nil || !strings.HasPrefix(string(raw), "%PDF-") || int64(len(raw)) != doc.ContentLength {
		t.Fatalf("not a PDF (%d bytes): %v", len(raw), err)
	}
	dir := t.TempDir()
	in := filepath.Join(dir, "invoice.pdf")
	if err := os.WriteFile(in, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-layout", in, "-").Output()
	if err != nil {
		t.Fatalf("pdftotext: %v", err)
	}
	return string(out)
}

func TestTenantAPIAndPDF(t *testing.T) {
	f := newFixture(t)
	h := invoices.NewHandlers(f.svc, pagination.Codec{Key: []byte("k")})
	f.tax = invoices.TaxProfile{Treatment: invoices.TreatmentStandard, DefaultRateBps: ptr(1900), Jurisdiction: ptr("DE"),
		SellerRegistration: ptr("DE999999999"), CustomerRegistration: ptr("DE111111111")}
	tenant, proj := f.tenant()
	other, otherProj := f.tenant()
	f.topUp(tenant, "USD", 100000)
	f.usage(tenant, proj, "USD", 2, midMarch, midMarch.Add(time.Hour))       // 7200
	f.usage(other, otherProj, "USD", 1, midMarch, midMarch.Add(time.Minute)) // 60
	f.clk.Set(april.Add(time.Hour))
	mar := f.close(tenant, "USD", march, april).Invoice
	otherInv := f.close(other, "USD", march, april).Invoice

	// Drafts are not shown to tenants.
	res, err := h.ListBillingInvoices(member(tenant), api.ListBillingInvoicesRequestObject{})
	if err != nil || len(res.(api.ListBillingInvoices200JSONResponse).Body.Items) != 0 {
		t.Fatalf("draft listed: %v %+v", err, res)
	}
	_, err = h.GetBillingInvoice(member(tenant), api.GetBillingInvoiceRequestObject{InvoiceID: mar.ID})
	wantErr(t, err, apierr.InvalidRequest, 404, "not_found")

	// Tenants may not issue; admins may.
	_, err = h.IssueBillingInvoice(member(tenant), api.IssueBillingInvoiceRequestObject{InvoiceID: mar.ID})
	wantErr(t, err, apierr.AdminRequired, 403, "")
	if _, err := h.IssueBillingInvoice(admin(), api.IssueBillingInvoiceRequestObject{InvoiceID: mar.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.IssueBillingInvoice(admin(), api.IssueBillingInvoiceRequestObject{InvoiceID: otherInv.ID}); err != nil {
		t.Fatal(err)
	}
	// The second April invoice of the tenant: a page of one, then the next.
	f.usage(tenant, proj, "USD", 1, april.AddDate(0, 0, 3), april.AddDate(0, 0, 3).Add(time.Minute))
	f.clk.Set(may.Add(time.Hour))
	apr := f.close(tenant, "USD", april, may).Invoice
	if _, err := h.IssueBillingInvoice(admin(), api.IssueBillingInvoiceRequestObject{InvoiceID: apr.ID}); err != nil {
		t.Fatal(err)
	}
	one := 1
	res, err = h.ListBillingInvoices(member(tenant), api.ListBillingInvoicesRequestObject{Params: api.ListBillingInvoicesParams{PageSize: &one}})
	if err != nil {
		t.Fatal(err)
	}
	page := res.(api.ListBillingInvoices200JSONResponse).Body
	if len(page.Items) != 1 || page.Items[0].ID != apr.ID || page.Pagination.NextCursor == nil {
		t.Fatalf("page 1 %+v", page)
	}
	res, err = h.ListBillingInvoices(member(tenant), api.ListBillingInvoicesRequestObject{Params: api.ListBillingInvoicesParams{PageSize: &one, Cursor: page.Pagination.NextCursor}})
	if err != nil {
		t.Fatal(err)
	}
	page = res.(api.ListBillingInvoices200JSONResponse).Body
	if len(page.Items) != 1 || page.Items[0].ID != mar.ID || page.Pagination.NextCursor != nil {
		t.Fatalf("page 2 %+v", page)
	}
	// Filters: the period window and status.
	from, to := march, april
	res, _ = h.ListBillingInvoices(member(tenant), api.ListBillingInvoicesRequestObject{Params: api.ListBillingInvoicesParams{From: &from, To: &to}})
	if items := res.(api.ListBillingInvoices200JSONResponse).Body.Items; len(items) != 1 || items[0].ID != mar.ID {
		t.Fatalf("window filter %+v", items)
	}
	due := api.BillingInvoiceStatus("paid")
	res, _ = h.ListBillingInvoices(member(tenant), api.ListBillingInvoicesRequestObject{Params: api.ListBillingInvoicesParams{Status: &due}})
	if items := res.(api.ListBillingInvoices200JSONResponse).Body.Items; len(items) != 0 {
		t.Fatalf("status filter %+v", items)
	}
	// Another tenant's invoice is not found, and never listed.
	_, err = h.GetBillingInvoice(member(tenant), api.GetBillingInvoiceRequestObject{InvoiceID: otherInv.ID})
	wantErr(t, err, apierr.InvalidRequest, 404, "not_found")
	// Admin list across tenants, filtered by org.
	res2, err := h.ListAdminBillingInvoices(admin(), api.ListAdminBillingInvoicesRequestObject{Params: api.ListAdminBillingInvoicesParams{OrgID: &other}})
	if err != nil || len(res2.(api.ListAdminBillingInvoices200JSONResponse).Body.Items) != 1 {
		t.Fatalf("admin list: %v", err)
	}
	_, err = h.ListAdminBillingInvoices(member(tenant), api.ListAdminBillingInvoicesRequestObject{})
	wantErr(t, err, apierr.AdminRequired, 403, "")

	// JSON detail: 7200 + 19% (1368) = 8568, tax line references the usage line.
	got, err := h.GetBillingInvoice(member(tenant), api.GetBillingInvoiceRequestObject{InvoiceID: mar.ID})
	if err != nil {
		t.Fatal(err)
	}
	d := got.(api.GetBillingInvoice200JSONResponse).Body
	if d.Total.AmountMinor != 8568 || d.TaxTotal.AmountMinor != 1368 || d.InvoiceNumber == nil || *d.InvoiceNumber != "GNT-000001" || d.Status != "due" {
		t.Fatalf("detail %+v", d)
	}
	var taxLine, usageLine *api.BillingInvoiceLine
	for i := range d.Lines {
		switch d.Lines[i].LineType {
		case "tax":
			taxLine = &d.Lines[i]
		case "rated_usage":
			usageLine = &d.Lines[i]
		}
	}
	if taxLine == nil || usageLine == nil || *taxLine.TaxSubjectLineID != usageLine.ID || *taxLine.TaxRateBps != 1900 {
		t.Fatalf("lines %+v", d.Lines)
	}

	// The PDF carries seller, customer, registrations, the tax breakdown and the totals.
	text := pdfText(t, h, member(tenant), mar.ID)
	for _, want := range []string{"Invoice GNT-000001", "Gantry GmbH", "DE999999999", "DE111111111", "Tax breakdown",
		"compute at 19% on 72.00 USD: 13.68 USD", "Subtotal", "72.00 USD", "Total", "85.68 USD", "Amount due", "13.68 USD",
		"2026-03-01 to 2026-04-01"} {
		if !strings.Contains(text, want) {
			t.Errorf("PDF text lacks %q:\n%s", want, text)
		}
	}

	// Void over the API: reason required; recredit asked for since the wallet paid.
	_, err = h.VoidBillingInvoice(admin(), api.VoidBillingInvoiceRequestObject{InvoiceID: mar.ID, Body: &api.BillingInvoiceVoidRequest{Reason: "wrong rate"}})
	wantErr(t, err, apierr.InvalidRequest, 409, "void_requires_recredit")
	yes := true
	v, err := h.VoidBillingInvoice(admin(), api.VoidBillingInvoiceRequestObject{InvoiceID: mar.ID, Body: &api.BillingInvoiceVoidRequest{Reason: "wrong rate", Recredit: &yes}})
	if err != nil || v.(api.VoidBillingInvoice200JSONResponse).Body.Status != "void" {
		t.Fatalf("void: %v", err)
	}
	w, err := h.WriteOffBillingInvoice(admin(), api.WriteOffBillingInvoiceRequestObject{InvoiceID: apr.ID, Body: &api.BillingInvoiceWriteOffRequest{Reason: "gone"}})
	if err != nil || w.(api.WriteOffBillingInvoice200JSONResponse).Body.Status != "write_off" {
		t.Fatalf("write off: %v", err)
	}
	if n := f.count(`SELECT count(*) FROM audit_events WHERE action IN ('billing.invoice.issue', 'billing.invoice.void', 'billing.invoice.write_off')`); n != 5 {
		t.Fatalf("%d admin audits, want 5", n)
	}
}

func TestFormatMoney(t *testing.T) {
	for _, c := range []struct {
		minor int64
		cur   string
		want  string
	}{{11900, "USD", "119.00 USD"}, {-5, "USD", "-0.05 USD"}, {1500, "JPY", "1500 JPY"}, {1234567, "KWD", "1234.567 KWD"}, {0, "EUR", "0.00 EUR"}} {
		if got := invoices.FormatMoney(c.minor, c.cur); got != c.want {
			t.Errorf("FormatMoney(%d, %s) = %q, want %q", c.minor, c.cur, got, c.want)
		}
	}
}
