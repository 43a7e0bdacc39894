package invoices

import (
	"cmp"
	"fmt"
	"math/big"
	"slices"
	"strings"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Tax treatments (seed BillingInvoiceSummary.tax_treatment).
const (
	TreatmentNotConfigured = "not_configured"
	TreatmentStandard      = "standard"
	TreatmentTaxExempt     = "tax_exempt"
	TreatmentReverseCharge = "reverse_charge"
)

// Treatments lists the treatments.
var Treatments = []string{TreatmentNotConfigured, TreatmentStandard, TreatmentTaxExempt, TreatmentReverseCharge}

// MaxRateBps is the largest tax rate (seed §8: tax_rate_bps 0..10000).
const MaxRateBps = 10000

// ReverseChargeNote is the legal note a reverse-charge invoice carries (and each of its
// charge lines as reverse_charge_reason).
const ReverseChargeNote = "Reverse charge: the recipient accounts for the VAT (Art. 196 Council Directive 2006/112/EC)"

// CategoryCompute is the tax category of rated GPU usage; other charges name their own.
const CategoryCompute = "compute"

// TaxProfile is what the billing account says about tax (the account's tax profile).
type TaxProfile struct {
	Treatment            string
	Jurisdiction         *string
	SellerRegistration   *string
	CustomerRegistration *string
	// Standard: the rate per tax category, and the rate of categories not listed.
	Rates          map[string]int
	DefaultRateBps *int
	// Exempt and reverse charge: why, and the evidence (certificate, VIES check, ...).
	ExemptReason *string
	Evidence     map[string]any
}

func nonEmpty(s *string) bool { return s != nil && strings.TrimSpace(*s) != "" }

func taxInvalid(field, reason, format string, args ...any) *apierr.Error {
	return apierr.Validation(field, "%s", fmt.Sprintf(format, args...)).With("reason", reason)
}

// Validate refuses a profile an invoice cannot be built with.
func (p TaxProfile) Validate() error {
	switch p.Treatment {
	case TreatmentNotConfigured:
		return nil
	case TreatmentStandard:
		if p.DefaultRateBps == nil && len(p.Rates) == 0 {
			return taxInvalid("tax_rate_bps", "tax_rate_missing", "standard tax needs a rate")
		}
		if p.DefaultRateBps != nil && (*p.DefaultRateBps < 0 || *p.DefaultRateBps > MaxRateBps) {
			return taxInvalid("tax_rate_bps", "tax_rate_out_of_range", "tax_rate_bps %d is outside 0..%d", *p.DefaultRateBps, MaxRateBps)
		}
		for cat, r := range p.Rates {
			if r < 0 || r > MaxRateBps {
				return taxInvalid("tax_rate_bps", "tax_rate_out_of_range", "tax_rate_bps %d of %s is outside 0..%d", r, cat, MaxRateBps)
			}
		}
		return nil
	case TreatmentReverseCharge:
		if !nonEmpty(p.CustomerRegistration) {
			return taxInvalid("customer_tax_registration", "reverse_charge_requires_registration", "reverse charge needs the customer's tax registration")
		}
		if len(p.Evidence) == 0 {
			return taxInvalid("tax_evidence", "reverse_charge_requires_evidence", "reverse charge needs evidence of the customer's registration")
		}
		return nil
	case TreatmentTaxExempt:
		if len(p.Evidence) == 0 {
			return taxInvalid("tax_evidence", "tax_exempt_requires_evidence", "a tax exemption needs evidence")
		}
		if !nonEmpty(p.ExemptReason) {
			return taxInvalid("tax_exempt_reason", "tax_exempt_requires_reason", "a tax exemption needs a reason")
		}
		return nil
	default:
		return taxInvalid("tax_treatment", "unknown_tax_treatment", "unknown tax treatment %q", p.Treatment)
	}
}

// RateFor is the standard rate of a category.
func (p TaxProfile) RateFor(category string) int {
	if r, ok := p.Rates[category]; ok {
		return r
	}
	if p.DefaultRateBps != nil {
		return *p.DefaultRateBps
	}
	return 0
}

// Taxable is a charge line as tax sees it.
type Taxable struct {
	Index    int // the line's position among the invoice's lines
	Category string
	Amount   int64 // >= 0
}

// TaxLine is one computed tax line: base × rate_bps / 10000 rounded once, half away
// from zero, over every charge of its (category, rate).
type TaxLine struct {
	Category string
	RateBps  int
	Base     int64
	Amount   int64
	Subjects []int // Index of the taxed lines, in order
}

// TaxOf is round(base × bps / 10000), half away from zero, computed exactly.
func TaxOf(base int64, bps int) int64 {
	num := new(big.Int).Mul(big.NewInt(base), big.NewInt(int64(bps)))
	den := big.NewInt(10000)
	q, r := new(big.Int).QuoRem(num, den, new(big.Int))
	// |r|*2 >= den rounds away from zero.
	r.Abs(r).Lsh(r, 1)
	if r.Cmp(den) >= 0 {
		if num.Sign() < 0 {
			q.Sub(q, big.NewInt(1))
		} else {
			q.Add(q, big.NewInt(1))
		}
	}
	return q.Int64()
}

// ComputeTax is the tax lines of the charges under p: standard gives one line per
// (category, rate) with a non-zero base, ordered by category then rate; every other
// treatment none.
func ComputeTax(p TaxProfile, charges []Taxable) ([]TaxLine, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if p.Treatment != TreatmentStandard {
		return nil, nil
	}
	type key struct {
		cat  string
		rate int
	}
	groups := map[key]*TaxLine{}
	for _, c := range charges {
		if c.Amount < 0 {
			return nil, fmt.Errorf("invoices: negative charge %d at line %d", c.Amount, c.Index)
		}
		k := key{c.Category, p.RateFor(c.Category)}
		g := groups[k]
		if g == nil {
			g = &TaxLine{Category: k.cat, RateBps: k.rate}
			groups[k] = g
		}
		sum, ok := addChecked(g.Base, c.Amount)
		if !ok {
			return nil, errOverflow
		}
		g.Base = sum
		g.Subjects = append(g.Subjects, c.Index)
	}
	out := make([]TaxLine, 0, len(groups))
	for _, g := range groups {
		if g.Base == 0 {
			continue
		}
		g.Amount = TaxOf(g.Base, g.RateBps)
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b TaxLine) int {
		return cmp.Or(cmp.Compare(a.Category, b.Category), cmp.Compare(a.RateBps, b.RateBps))
	})
	return out, nil
}
