package billing

import (
	"fmt"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cockroachdb/apd/v3"
)

// oracle rounds price × units × 10^exp half away from zero with exact rationals.
func oracle(price string, units int64, exp int) int64 {
	r, ok := new(big.Rat).SetString(price)
	if !ok {
		panic(price)
	}
	r.Mul(r, new(big.Rat).SetInt64(units))
	r.Mul(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(exp)), nil)))
	num, den := new(big.Int).Set(r.Num()), r.Denom()
	neg := num.Sign() < 0
	num.Abs(num)
	q, rem := new(big.Int).QuoRem(num, den, new(big.Int))
	if new(big.Int).Mul(rem, big.NewInt(2)).Cmp(den) >= 0 {
		q.Add(q, big.NewInt(1))
	}
	if neg {
		q.Neg(q)
	}
	return q.Int64()
}

func randPrice(r *rand.Rand) string {
	whole := r.IntN(20)
	digits := r.IntN(13)
	if digits == 0 {
		return fmt.Sprint(whole)
	}
	frac := ""
	for range digits {
		frac += fmt.Sprint(r.IntN(10))
	}
	return fmt.Sprintf("%d.%s", whole, frac)
}

func mustDec(s string) *apd.Decimal {
	d, _, err := apd.NewFromString(s)
	if err != nil {
		panic(err)
	}
	return d
}

// Property: rating a run equals the exact big.Rat oracle — whole seconds rounded up
// once per run, price × units exact, one rounding half away from zero.
func TestRatedAmountMatchesExactOracle(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20_000 {
		price := randPrice(r)
		ms := r.Int64N(40 * 24 * 3600 * 1000)
		qty := 1 + r.Int64N(16)
		exp := []int{0, 2, 3}[r.IntN(3)]
		units := RunUnits(ms, qty)
		if want := ((ms + 999) / 1000) * qty; units != want {
			t.Fatalf("units %d want %d", units, want)
		}
		got, exact, err := RatedAmount(mustDec(price), units, exp)
		if err != nil {
			t.Fatal(err)
		}
		if want := oracle(price, units, exp); got != want {
			t.Fatalf("case %d: %s × %d (exp %d) = %d, oracle %d (exact %s)", i, price, units, exp, got, want, exact.Text('f'))
		}
	}
	// Half away from zero at the exact midpoint.
	for _, c := range []struct {
		price string
		units int64
		exp   int
		want  int64
	}{{"0.005", 1, 2, 1}, {"0.0049999", 1, 2, 0}, {"0.5", 1, 0, 1}, {"0.0005", 1, 3, 1}, {"0.015", 3, 2, 5}} {
		if got, _, _ := RatedAmount(mustDec(c.price), c.units, c.exp); got != c.want {
			t.Fatalf("%s × %d: %d want %d", c.price, c.units, got, c.want)
		}
	}
}

func flatPrice(p string, from time.Time) func(time.Time) (*priceVersion, time.Time, error) {
	pv := &priceVersion{price: mustDec(p), priceText: p, effectiveFrom: from, version: 1}
	return func(time.Time) (*priceVersion, time.Time, error) { return pv, time.Time{}, nil }
}

// twoVersions changes price at switchAt.
func twoVersions(p1, p2 string, start, switchAt time.Time) func(time.Time) (*priceVersion, time.Time, error) {
	v1 := &priceVersion{price: mustDec(p1), priceText: p1, effectiveFrom: start.Add(-time.Hour), version: 1}
	v2 := &priceVersion{price: mustDec(p2), priceText: p2, effectiveFrom: switchAt, version: 2}
	return func(t time.Time) (*priceVersion, time.Time, error) {
		if t.Before(switchAt) {
			return v1, switchAt, nil
		}
		return v2, time.Time{}, nil
	}
}

// Property: rating a run incrementally at random points (booking the difference of
// cumulative ratings) sums to the one-shot rating, line by line amounts never negative,
// and the total units are the run's whole seconds × quantity — also across a month
// boundary and a price-version change.
func TestDeltaRatingSumsToOneShot(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 9))
	for i := range 2_000 {
		start := time.Date(2026, 1, 31, 23, 0, 0, 0, time.UTC).Add(time.Duration(r.Int64N(int64(2*time.Hour))) + time.Duration(r.IntN(1000))*time.Millisecond)
		dur := time.Duration(1+r.Int64N(int64(3*time.Hour))) / time.Millisecond * time.Millisecond
		end := start.Add(dur)
		qty := 1 + r.Int64N(8)
		exp := []int{0, 2, 3}[r.IntN(3)]
		p1, p2 := randPrice(r), randPrice(r)
		priceAt := flatPrice(p1, start)
		if r.IntN(2) == 0 {
			priceAt = twoVersions(p1, p2, start, start.Add(time.Duration(r.Int64N(int64(dur)))).Truncate(time.Millisecond))
		}
		st0 := runState{ratedThrough: start, segFrom: start}
		oneShot, _, err := ratePieces(start, qty, exp, st0, end, priceAt)
		if err != nil {
			t.Fatal(err)
		}
		st := st0
		var inc []ratedPiece
		for st.ratedThrough.Before(end) {
			next := st.ratedThrough.Add(time.Duration(1+r.Int64N(int64(dur/3+1))) / time.Millisecond * time.Millisecond)
			if next.After(end) {
				next = end
			}
			var ps []ratedPiece
			ps, st, err = ratePieces(start, qty, exp, st, next, priceAt)
			if err != nil {
				t.Fatal(err)
			}
			inc = append(inc, ps...)
		}
		sum := func(ps []ratedPiece) (amount, units, qms int64) {
			for _, p := range ps {
				if p.amount < 0 || p.units < 0 {
					t.Fatalf("negative piece %+v", p)
				}
				amount += p.amount
				units += p.units
				qms += p.quantityMillis
			}
			return
		}
		a1, u1, q1 := sum(oneShot)
		a2, u2, q2 := sum(inc)
		if a1 != a2 || u1 != u2 || q1 != q2 {
			t.Fatalf("case %d: one-shot %d/%d/%d, incremental %d/%d/%d", i, a1, u1, q1, a2, u2, q2)
		}
		if want := RunUnits(dur.Milliseconds(), qty); u1 != want {
			t.Fatalf("case %d: units %d want %d", i, u1, want)
		}
		// The one-shot total is the oracle per segment.
		var want int64
		segUnits := map[time.Time]int64{}
		segPrice := map[time.Time]string{}
		for _, p := range oneShot {
			segUnits[p.segFrom] += p.units
			segPrice[p.segFrom] = p.price.priceText
		}
		for s, u := range segUnits {
			want += oracle(segPrice[s], u, exp)
		}
		if a1 != want {
			t.Fatalf("case %d: %d, oracle %d", i, a1, want)
		}
		// A run crossing 1 February is split there.
		if start.Before(time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)) && end.After(time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)) {
			if _, ok := segUnits[time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)]; !ok {
				t.Fatalf("case %d: no segment at the month boundary", i)
			}
		}
	}
}
