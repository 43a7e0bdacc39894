package invoices

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	"github.com/go-pdf/fpdf"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
)

// FormatMoney spells minor units in the currency's exponent: 11900 USD → "119.00 USD",
// -5 USD → "-0.05 USD", 1500 JPY → "1500 JPY".
func FormatMoney(minor int64, currency string) string {
	exp, ok := billing.Exponent(currency)
	if !ok || exp == 0 {
		return fmt.Sprintf("%d %s", minor, currency)
	}
	sign := ""
	u := uint64(minor)
	if minor < 0 {
		sign, u = "-", uint64(-minor)
	}
	div := uint64(1)
	for range exp {
		div *= 10
	}
	return fmt.Sprintf("%s%d.%0*d %s", sign, u/div, exp, u%div, currency)
}

// RenderPDF renders inv (with its lines) as a PDF: seller and customer with their tax
// registrations, the period and dates, every line, the tax breakdown, the totals and
// the legal notes. Text is what pdftotext reads back (the tests check it).
func RenderPDF(inv Invoice) ([]byte, error) {
	pdf := fpdf.New("P", "mm", "A4", "")
	pdf.SetTitle("Invoice "+deref(inv.Number, "draft"), true)
	pdf.SetCreator("Gantry", true)
	pdf.SetAutoPageBreak(true, 15)
	tr := pdf.UnicodeTranslatorFromDescriptor("") // cp1252 for the core fonts
	pdf.AddPage()

	title := "Invoice " + deref(inv.Number, "")
	if inv.Number == nil {
		title = "Draft invoice (not issued)"
	}
	pdf.SetFont("Helvetica", "B", 16)
	pdf.CellFormat(0, 9, tr(title), "", 1, "L", false, 0, "")
	pdf.SetFont("Helvetica", "", 9)
	day := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return t.UTC().Format("2006-01-02")
	}
	info := []string{
		"Status: " + inv.Status,
		fmt.Sprintf("Period: %s to %s", inv.PeriodStart.UTC().Format("2006-01-02"), inv.PeriodEnd.UTC().Format("2006-01-02")),
		"Issued: " + day(inv.IssuedAt) + "   Due: " + day(inv.DueAt),
		"Invoice id: " + inv.ID.String(),
	}
	for _, s := range info {
		pdf.CellFormat(0, 5, tr(s), "", 1, "L", false, 0, "")
	}
	pdf.Ln(3)

	party := func(label, name string, reg *string) []string {
		out := []string{label, name}
		if reg != nil && *reg != "" {
			out = append(out, "Tax registration: "+*reg)
		}
		return out
	}
	seller := party("Seller", inv.SellerName, inv.SellerTaxRegistration)
	customer := party("Customer", inv.CustomerName, inv.CustomerTaxRegistration)
	y := pdf.GetY()
	for i, col := range [][]string{seller, customer} {
		pdf.SetXY(10+float64(i)*95, y)
		for j, s := range col {
			if j == 0 {
				pdf.SetFont("Helvetica", "B", 10)
			} else {
				pdf.SetFont("Helvetica", "", 9)
			}
			pdf.SetX(10 + float64(i)*95)
			pdf.CellFormat(95, 5, tr(s), "", 1, "L", false, 0, "")
		}
	}
	pdf.SetY(y + 20)
	tax := "Tax treatment: " + inv.TaxTreatment
	if inv.TaxJurisdiction != nil {
		tax += " (" + *inv.TaxJurisdiction + ")"
	}
	pdf.CellFormat(0, 5, tr(tax), "", 1, "L", false, 0, "")
	pdf.Ln(2)

	// Lines.
	pdf.SetFont("Helvetica", "B", 9)
	pdf.SetFillColor(235, 235, 235)
	pdf.CellFormat(10, 6, "#", "B", 0, "L", true, 0, "")
	pdf.CellFormat(22, 6, "Type", "B", 0, "L", true, 0, "")
	pdf.CellFormat(123, 6, "Description", "B", 0, "L", true, 0, "")
	pdf.CellFormat(35, 6, "Amount", "B", 1, "R", true, 0, "")
	pdf.SetFont("Helvetica", "", 8)
	var taxes []Line
	for _, l := range inv.Lines {
		if l.Type == LineTax {
			taxes = append(taxes, l)
		}
		amount := l.Amount
		if l.Type == LineCredit {
			amount = -amount
		}
		desc := l.Description
		if len(desc) > 95 {
			desc = desc[:92] + "..."
		}
		pdf.CellFormat(10, 5, fmt.Sprint(l.Position+1), "", 0, "L", false, 0, "")
		pdf.CellFormat(22, 5, l.Type, "", 0, "L", false, 0, "")
		pdf.CellFormat(123, 5, tr(desc), "", 0, "L", false, 0, "")
		pdf.CellFormat(35, 5, FormatMoney(amount, inv.Currency), "", 1, "R", false, 0, "")
	}
	pdf.Ln(3)

	// Tax breakdown.
	if len(taxes) > 0 {
		pdf.SetFont("Helvetica", "B", 9)
		pdf.CellFormat(0, 6, "Tax breakdown", "", 1, "L", false, 0, "")
		pdf.SetFont("Helvetica", "", 8)
		for _, l := range taxes {
			base, _ := l.TaxEvidence["base_minor"].(float64)
			rate := 0
			if l.TaxRateBps != nil {
				rate = *l.TaxRateBps
			}
			pdf.CellFormat(0, 5, tr(fmt.Sprintf("%s at %s%% on %s: %s", deref(l.TaxCategory, "-"), bpsPercent(rate),
				FormatMoney(int64(base), inv.Currency), FormatMoney(l.Amount, inv.Currency))), "", 1, "L", false, 0, "")
		}
		pdf.Ln(2)
	}

	// Totals.
	t := inv.Totals
	rows := [][2]string{
		{"Subtotal", FormatMoney(t.Subtotal, inv.Currency)},
		{"Tax", FormatMoney(t.Tax, inv.Currency)},
		{"Credits", FormatMoney(-t.Credits, inv.Currency)},
		{"Total", FormatMoney(t.Total, inv.Currency)},
		{"Paid from prepaid balance", FormatMoney(t.Prepaid, inv.Currency)},
		{"Paid since issue", FormatMoney(inv.Paid, inv.Currency)},
		{"Amount due", FormatMoney(inv.AmountDue(), inv.Currency)},
	}
	for _, r := range rows {
		bold := r[0] == "Total" || r[0] == "Amount due"
		if bold {
			pdf.SetFont("Helvetica", "B", 10)
		} else {
			pdf.SetFont("Helvetica", "", 9)
		}
		pdf.CellFormat(140, 6, r[0], "", 0, "R", false, 0, "")
		pdf.CellFormat(50, 6, r[1], "", 1, "R", false, 0, "")
	}
	if inv.LegalNote != nil && *inv.LegalNote != "" {
		pdf.Ln(4)
		pdf.SetFont("Helvetica", "I", 8)
		for _, n := range strings.Split(*inv.LegalNote, "\n") {
			pdf.MultiCell(0, 4, tr(n), "", "L", false)
		}
	}
	var buf bytes.Buffer
	if err := pdf.Output(&buf); err != nil {
		return nil, fmt.Errorf("render invoice pdf: %w", err)
	}
	return buf.Bytes(), nil
}
