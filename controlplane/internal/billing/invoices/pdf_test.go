package invoices

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

// A long invoice spans pages; non-ASCII names survive (cp1252 core fonts); the reverse
// charge note and the totals are on it.
func TestRenderPDFLongInvoice(t *testing.T) {
	bin, err := exec.LookPath("pdftotext")
	ci.SkipUnlessAvailable(t, "pdftotext (poppler-utils)", err)
	num, note, reg := "GNT-000042", ReverseChargeNote, "FR12345678901"
	issued := time.Date(2026, 4, 1, 9, 0, 0, 0, time.UTC)
	due := issued.AddDate(0, 0, 30)
	inv := Invoice{
		ID: uuid.New(), Currency: "EUR", Status: StatusDue, Number: &num, SellerName: "Gantry GmbH", CustomerName: "Müller & Söhne SARL",
		CustomerTaxRegistration: &reg, TaxTreatment: TreatmentReverseCharge, LegalNote: &note,
		PeriodStart: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), PeriodEnd: time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC),
		IssuedAt: &issued, DueAt: &due,
	}
	var sum int64
	for i := range 150 {
		amount := int64(1000 + i)
		sum += amount
		inv.Lines = append(inv.Lines, Line{Position: i, Type: LineRatedUsage, Currency: "EUR", Amount: amount,
			Description: fmt.Sprintf("gpu.h100 usage run %03d", i)})
	}
	inv.Totals = Totals{Subtotal: sum, Total: sum}
	doc, err := RenderPDF(inv)
	if err != nil {
		t.Fatal(err)
	}
	in := filepath.Join(t.TempDir(), "long.pdf")
	if err := os.WriteFile(in, doc, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-layout", in, "-").Output()
	if err != nil {
		t.Fatal(err)
	}
	text := string(out)
	pages := strings.Count(text, "\f")
	for _, want := range []string{"Invoice GNT-000042", "Müller & Söhne SARL", "FR12345678901", "gpu.h100 usage run 000",
		"gpu.h100 usage run 149", "Total", FormatMoney(sum, "EUR"), "Reverse charge", "Due: 2026-05-01"} {
		if !strings.Contains(text, want) {
			t.Errorf("PDF lacks %q", want)
		}
	}
	if pages < 2 {
		t.Fatalf("150 lines on %d page(s)", pages)
	}
}
