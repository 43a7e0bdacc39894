package invoices

import (
	"errors"
	"fmt"
	"math"
)

// Line types (seed BillingInvoiceLine.line_type).
const (
	LineRatedUsage = "rated_usage"
	LineCredit     = "credit"
	LineAdjustment = "adjustment"
	LineTax        = "tax"
	LineFee        = "fee"
	LinePayment    = "payment"
)

var errOverflow = errors.New("invoices: amount overflows int64")

func addChecked(a, b int64) (int64, bool) {
	s := a + b
	if (b > 0 && s < a) || (b < 0 && s > a) {
		return 0, false
	}
	return s, true
}

// Totals are an invoice's figures in minor units: Total = Subtotal + Tax − Credits.
type Totals struct {
	Subtotal int64 // Σ charges: rated usage, fees, adjustments
	Tax      int64 // Σ tax lines
	Credits  int64 // Σ credits (amounts taken off, >= 0)
	Received int64 // Σ payment lines (money received in the period); not in Total
	Total    int64
	// Prepaid is what the wallet already paid of the charges when they were rated. It
	// is not a sum of lines (Sum leaves it 0, Check ignores it) and not in Total.
	Prepaid int64
}

// Amounted is a line as totals see it.
type Amounted struct {
	Type   string
	Amount int64
}

// Sum adds up lines exactly; every amount must be >= 0 (a credit is what it takes off).
func Sum(lines []Amounted) (Totals, error) {
	var t Totals
	for i, l := range lines {
		if l.Amount < 0 {
			return Totals{}, fmt.Errorf("invoices: line %d (%s) has negative amount %d", i, l.Type, l.Amount)
		}
		var dst *int64
		switch l.Type {
		case LineRatedUsage, LineFee, LineAdjustment:
			dst = &t.Subtotal
		case LineTax:
			dst = &t.Tax
		case LineCredit:
			dst = &t.Credits
		case LinePayment:
			dst = &t.Received
		default:
			return Totals{}, fmt.Errorf("invoices: line %d has unknown type %q", i, l.Type)
		}
		s, ok := addChecked(*dst, l.Amount)
		if !ok {
			return Totals{}, errOverflow
		}
		*dst = s
	}
	s, ok := addChecked(t.Subtotal, t.Tax)
	if !ok || t.Credits == math.MinInt64 {
		return Totals{}, errOverflow
	}
	if t.Total, ok = addChecked(s, -t.Credits); !ok {
		return Totals{}, errOverflow
	}
	return t, nil
}

// Check recomputes the totals of lines and refuses figures that differ from them
// (Prepaid aside).
func Check(t Totals, lines []Amounted) error {
	got, err := Sum(lines)
	if err != nil {
		return err
	}
	got.Prepaid = t.Prepaid
	if got != t {
		return fmt.Errorf("invoices: totals %+v differ from the lines' %+v", t, got)
	}
	if t.Total != t.Subtotal+t.Tax-t.Credits {
		return fmt.Errorf("invoices: total %d is not subtotal %d + tax %d - credits %d", t.Total, t.Subtotal, t.Tax, t.Credits)
	}
	return nil
}
