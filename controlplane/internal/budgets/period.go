package budgets

import (
	"math/big"
	"time"
)

// Periods (seed BillingBudgetPosture.period).
const (
	PeriodMonthly   = "monthly"
	PeriodQuarterly = "quarterly"
	PeriodAnnual    = "annual"
	PeriodCustom    = "custom"
)

// Periods lists the periods.
var Periods = []string{PeriodMonthly, PeriodQuarterly, PeriodAnnual, PeriodCustom}

// Window is one budget period, [Start, End).
type Window struct {
	Start, End time.Time
}

// calendarPeriod is the UTC calendar month, quarter or year that holds t.
func calendarPeriod(period string, t time.Time) Window {
	t = t.UTC()
	var start time.Time
	var months int
	switch period {
	case PeriodQuarterly:
		start = time.Date(t.Year(), ((t.Month()-1)/3)*3+1, 1, 0, 0, 0, 0, time.UTC)
		months = 3
	case PeriodAnnual:
		start = time.Date(t.Year(), time.January, 1, 0, 0, 0, 0, time.UTC)
		months = 12
	default:
		start = time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
		months = 1
	}
	return Window{Start: start, End: start.AddDate(0, months, 0)}
}

// DefaultStart is where a budget created at now without starts_at begins: the start of
// the calendar period that holds now, so the whole current period counts.
func DefaultStart(period string, now time.Time) time.Time {
	return calendarPeriod(period, now).Start
}

// PeriodAt is the budget period that holds t, and false when the budget has none then
// (before starts_at, at or after ends_at). Monthly, quarterly and annual periods are UTC
// calendar periods clipped to [starts_at, ends_at); a custom budget has the one period
// [starts_at, ends_at).
func PeriodAt(period string, startsAt time.Time, endsAt *time.Time, t time.Time) (Window, bool) {
	if t.Before(startsAt) || (endsAt != nil && !t.Before(*endsAt)) {
		return Window{}, false
	}
	if period == PeriodCustom {
		if endsAt == nil {
			return Window{}, false
		}
		return Window{Start: startsAt.UTC(), End: endsAt.UTC()}, true
	}
	w := calendarPeriod(period, t)
	if w.Start.Before(startsAt) {
		w.Start = startsAt.UTC()
	}
	if endsAt != nil && endsAt.Before(w.End) {
		w.End = endsAt.UTC()
	}
	return w, true
}

// PercentUsed is ⌊spent × 100 / amount⌋, exact (amount > 0). 99.99 % is 99.
func PercentUsed(spent, amount int64) int64 {
	q := new(big.Int).Mul(big.NewInt(spent), big.NewInt(100))
	q.Div(q, big.NewInt(amount)) // Euclidean: the floor for a positive divisor
	if !q.IsInt64() {
		if q.Sign() > 0 {
			return 1<<63 - 1
		}
		return -1 << 63
	}
	return q.Int64()
}

// Reached reports whether spent has reached percent % of amount: spent × 100 ≥
// percent × amount, compared exactly (no rounding). This is THE comparison of the
// package: a threshold is crossed, and a budget exhausted (percent 100), at exactly the
// level, not only above it.
func Reached(spent, amount int64, percent int) bool {
	l := new(big.Int).Mul(big.NewInt(spent), big.NewInt(100))
	r := new(big.Int).Mul(big.NewInt(int64(percent)), big.NewInt(amount))
	return l.Cmp(r) >= 0
}

// addSat is a + b, saturated at the int64 range.
func addSat(a, b int64) int64 {
	s := a + b
	if a > 0 && b > 0 && s < 0 {
		return 1<<63 - 1
	}
	if a < 0 && b < 0 && s >= 0 {
		return -1 << 63
	}
	return s
}
