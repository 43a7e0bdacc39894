package billing

import (
	"fmt"
	"time"

	"github.com/cockroachdb/apd/v3"
)

// The rating arithmetic, free of storage so that it can be checked against an exact
// oracle: a run meters quantity x elapsed milliseconds; the run's elapsed time is rounded
// up to whole seconds (once per run, not per line); an amount is price x units computed
// exactly and rounded once, half away from zero, to the currency's minor unit.

// ceilSeconds is ms rounded up to whole seconds.
func ceilSeconds(ms int64) int64 {
	if ms <= 0 {
		return 0
	}
	return (ms + 999) / 1000
}

// RunUnits is the billable units of a run at elapsed ms: whole seconds (rounded up)
// times the quantity metered concurrently.
func RunUnits(elapsedMillis, quantity int64) int64 { return ceilSeconds(elapsedMillis) * quantity }

// ExactAmount is price x units, exact (in major units of the currency).
func ExactAmount(price *apd.Decimal, units int64) (*apd.Decimal, error) {
	var out apd.Decimal
	if _, err := decimalCtx.Mul(&out, price, apd.New(units, 0)); err != nil {
		return nil, fmt.Errorf("rating: %w", err)
	}
	return &out, nil
}

// RatedAmount is price x units rounded once, half away from zero, to minor units of a
// currency with exponent exp, and the exact amount it was rounded from.
func RatedAmount(price *apd.Decimal, units int64, exp int) (int64, *apd.Decimal, error) {
	exact, err := ExactAmount(price, units)
	if err != nil {
		return 0, nil, err
	}
	minor, err := RoundMinor(exact, exp)
	return minor, exact, err
}

// segmentStart is where the segment holding t starts: the latest of the run's start,
// the month start (UTC) and the effective_from of the price version in force.
func segmentStart(billFrom, t time.Time, versionFrom time.Time) time.Time {
	s := billFrom
	if m := monthStart(t); m.After(s) {
		s = m
	}
	if versionFrom.After(s) && !versionFrom.After(t) {
		s = versionFrom
	}
	return s
}

func monthStart(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
}

func nextMonth(t time.Time) time.Time { return monthStart(t).AddDate(0, 1, 0) }

// ratedPiece is one line of a rating: an increment of one segment.
type ratedPiece struct {
	segFrom, from, to time.Time
	quantityMillis    int64
	units, cumUnits   int64
	amount, cumAmount int64
	exact             *apd.Decimal
	price             *priceVersion
}

// runState is where a run's rating stands: rated through, and the last segment's
// cumulative units and booked amount.
type runState struct {
	ratedThrough time.Time
	segFrom      time.Time
	segUnits     int64
	segAmount    int64
}

// ratePieces rates a run from st.ratedThrough to through (both within the run) and
// returns the lines and the new state. priceAt answers the price version in force at a
// time and when the next version starts (zero time: none).
func ratePieces(billFrom time.Time, quantity int64, exp int, st runState, through time.Time,
	priceAt func(time.Time) (*priceVersion, time.Time, error)) ([]ratedPiece, runState, error) {
	var out []ratedPiece
	ms := func(t time.Time) int64 { return t.Sub(billFrom).Milliseconds() }
	cur := st.ratedThrough
	for cur.Before(through) {
		pv, nextVersion, err := priceAt(cur)
		if err != nil {
			return nil, st, err
		}
		s := segmentStart(billFrom, cur, pv.effectiveFrom)
		if !s.Equal(st.segFrom) {
			st.segFrom, st.segUnits, st.segAmount = s, 0, 0
		}
		e := nextMonth(cur)
		if !nextVersion.IsZero() && nextVersion.Before(e) {
			e = nextVersion
		}
		if through.Before(e) {
			e = through
		}
		cumUnits := RunUnits(ms(e), quantity) - RunUnits(ms(s), quantity)
		cumAmount, _, err := RatedAmount(pv.price, cumUnits, exp)
		if err != nil {
			return nil, st, err
		}
		units := cumUnits - st.segUnits
		exact, err := ExactAmount(pv.price, units)
		if err != nil {
			return nil, st, err
		}
		out = append(out, ratedPiece{
			segFrom: s, from: cur, to: e, quantityMillis: (ms(e) - ms(cur)) * quantity,
			units: units, cumUnits: cumUnits, amount: cumAmount - st.segAmount, cumAmount: cumAmount,
			exact: exact, price: pv,
		})
		st.segUnits, st.segAmount = cumUnits, cumAmount
		cur = e
	}
	st.ratedThrough = cur
	return out, st, nil
}
