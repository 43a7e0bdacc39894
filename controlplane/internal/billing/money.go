package billing

import (
	"fmt"
	"math"

	"github.com/cockroachdb/apd/v3"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

// exponents are the ISO 4217 minor-unit exponents of the currencies billing knows. It
// mirrors the billing_currencies table (migration 00100); a test keeps the two equal.
var exponents = map[string]int{
	"USD": 2, "EUR": 2, "GBP": 2, "CHF": 2, "CAD": 2, "AUD": 2, "SEK": 2, "NOK": 2, "DKK": 2, "PLN": 2,
	"SGD": 2, "INR": 2, "CNY": 2, "BRL": 2,
	"JPY": 0, "KRW": 0,
	"KWD": 3, "BHD": 3, "JOD": 3, "OMR": 3,
}

// Exponent is the number of minor-unit digits of currency (USD 2, JPY 0, KWD 3).
func Exponent(currency string) (int, bool) {
	e, ok := exponents[currency]
	return e, ok
}

// Currencies is every currency billing knows.
func Currencies() map[string]int {
	out := make(map[string]int, len(exponents))
	for k, v := range exponents {
		out[k] = v
	}
	return out
}

func checkCurrency(field, currency string) error {
	if _, ok := exponents[currency]; !ok {
		return apierr.Validation(field, "currency %q is not supported", currency).With("reason", "unsupported_currency")
	}
	return nil
}

// decimalCtx is exact for every amount billing handles: 34 digits covers a price with
// 18 fractional digits times any int64 quantity.
var decimalCtx = func() *apd.Context {
	c := apd.BaseContext.WithPrecision(60)
	c.Rounding = apd.RoundHalfUp // half away from zero (apd's HalfUp rounds magnitudes)
	return c
}()

// ParseAmount reads a decimal amount of currency ("12.34" USD) into minor units. An
// amount with more fractional digits than the currency's exponent ("12.345" USD, "1.5"
// JPY) is refused with validation_error, never rounded.
func ParseAmount(field, currency, s string) (int64, error) {
	exp, ok := exponents[currency]
	if !ok {
		return 0, checkCurrency(field, currency)
	}
	d, _, err := apd.NewFromString(s)
	if err != nil || d.Form != apd.Finite {
		return 0, apierr.Validation(field, "amount is not a decimal number").With("reason", "malformed_amount")
	}
	if -int(d.Exponent) > exp {
		// Trailing zeros beyond the exponent are still the same precision ("1.50" USD ok,
		// "1.500" is not): refuse anything written finer than the currency's minor unit.
		return 0, apierr.Validation(field, "%s has %d decimal places; %s is not a valid amount", currency, exp, s).
			With("reason", "precision")
	}
	minor, err := toMinor(d, exp)
	if err != nil {
		return 0, apierr.Validation(field, "amount is out of range").With("reason", "out_of_range")
	}
	return minor, nil
}

// toMinor scales d (already at most exp fractional digits) to an int64 of minor units.
func toMinor(d *apd.Decimal, exp int) (int64, error) {
	var m apd.Decimal
	if _, err := decimalCtx.Mul(&m, d, apd.New(1, int32(exp))); err != nil {
		return 0, err
	}
	return m.Int64()
}

// RoundMinor rounds amount (in major units of currency, e.g. dollars) once, half away
// from zero, to minor units.
func RoundMinor(amount *apd.Decimal, exp int) (int64, error) {
	var scaled, rounded apd.Decimal
	if _, err := decimalCtx.Mul(&scaled, amount, apd.New(1, int32(exp))); err != nil {
		return 0, err
	}
	if _, err := decimalCtx.Quantize(&rounded, &scaled, 0); err != nil {
		return 0, err
	}
	v, err := rounded.Int64()
	if err != nil {
		return 0, fmt.Errorf("amount out of range: %w", err)
	}
	if v == math.MinInt64 {
		return 0, fmt.Errorf("amount out of range")
	}
	return v, nil
}

// ParseRate reads an exact positive decimal (a price or an FX rate). Zero, negative,
// exponent notation and anything malformed are refused.
func ParseRate(field, s string, allowZero bool) (*apd.Decimal, error) {
	bad := apierr.Validation(field, "%s must be a positive decimal such as 0.00125", field).With("reason", "malformed_decimal")
	if len(s) == 0 || len(s) > 40 {
		return nil, bad
	}
	dot := false
	for i, c := range s {
		switch {
		case c >= '0' && c <= '9':
		case c == '.' && !dot && i > 0 && i < len(s)-1:
			dot = true
		default:
			return nil, bad
		}
	}
	d, _, err := apd.NewFromString(s)
	if err != nil {
		return nil, bad
	}
	if d.IsZero() && !allowZero {
		return nil, apierr.Validation(field, "%s must be greater than zero", field).With("reason", "not_positive")
	}
	return d, nil
}
