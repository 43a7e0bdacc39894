package agent

import (
	"testing"
	"time"
)

func TestBackoffBounds(t *testing.T) {
	const ms = time.Millisecond
	cases := []struct {
		n       int
		lo, hi  time.Duration
		ceiling time.Duration
	}{
		{0, 250 * ms, 500 * ms, 500 * ms},
		{1, 500 * ms, time.Second, time.Second},
		{2, time.Second, 2 * time.Second, 2 * time.Second},
		{5, 8 * time.Second, 16 * time.Second, 16 * time.Second},
		{6, 15 * time.Second, 30 * time.Second, 30 * time.Second},
		{7, 15 * time.Second, 30 * time.Second, 30 * time.Second},
		{1000, 15 * time.Second, 30 * time.Second, 30 * time.Second}, // no overflow
	}
	for _, c := range cases {
		lo := Backoff{Min: 500 * ms, Max: 30 * time.Second, Rand: func() float64 { return 0 }}
		hi := Backoff{Min: 500 * ms, Max: 30 * time.Second, Rand: func() float64 { return 0.999999999 }}
		if got := lo.Ceiling(c.n); got != c.ceiling {
			t.Errorf("Ceiling(%d) = %v, want %v", c.n, got, c.ceiling)
		}
		if got := lo.Delay(c.n); got != c.lo {
			t.Errorf("Delay(%d) with rand 0 = %v, want %v", c.n, got, c.lo)
		}
		if got := hi.Delay(c.n); got > c.hi || got < c.hi-ms {
			t.Errorf("Delay(%d) with rand ~1 = %v, want just under %v", c.n, got, c.hi)
		}
	}
}

func TestBackoffNeverExceedsMax(t *testing.T) {
	b := DefaultBackoff()
	for n := range 200 {
		for range 20 {
			d := b.Delay(n)
			if d > b.Max || d < b.Min/2 {
				t.Fatalf("Delay(%d) = %v outside [%v, %v]", n, d, b.Min/2, b.Max)
			}
		}
	}
}

func TestBackoffMidpointJitter(t *testing.T) {
	b := Backoff{Min: time.Second, Max: time.Minute, Rand: func() float64 { return 0.5 }}
	if got := b.Delay(2); got != 3*time.Second { // ceiling 4s: 2s + 0.5·2s
		t.Fatalf("Delay(2) = %v, want 3s", got)
	}
}

func TestBackoffSpreadDelay(t *testing.T) {
	for r, want := range map[float64]time.Duration{0: 0, 0.5: 5 * time.Second, 0.25: 2500 * time.Millisecond} {
		b := DefaultBackoff()
		b.Rand = func() float64 { return r }
		if got := b.SpreadDelay(); got != want {
			t.Errorf("SpreadDelay with rand %v = %v, want %v", r, got, want)
		}
	}
	// Without a spread it is the first retry's delay.
	b := Backoff{Min: time.Second, Max: time.Minute, Rand: func() float64 { return 0.5 }}
	if got := b.SpreadDelay(); got != 750*time.Millisecond {
		t.Fatalf("SpreadDelay without Spread = %v, want Delay(0) = 750ms", got)
	}
}

// Within RecentWindow of an established tunnel's end the ceiling is RecentMax (10 s),
// not Max (30 s): an agent does not sleep 30 s through a control-plane restart.
func TestBackoffRetryCappedAfterAnEstablishedTunnel(t *testing.T) {
	b := DefaultBackoff()
	b.Rand = func() float64 { return 0.999999999 }
	for _, c := range []struct {
		n     int
		since time.Duration
		hi    time.Duration
	}{
		{10, 5 * time.Second, 10 * time.Second},    // recent: capped
		{10, 119 * time.Second, 10 * time.Second},  // still inside the window
		{10, 2 * time.Minute, 30 * time.Second},    // window over: Max again
		{10, -1, 30 * time.Second},                 // never established: Max
		{2, 5 * time.Second, 2 * time.Second},      // below the cap: unchanged
		{1000, time.Millisecond, 10 * time.Second}, // no overflow
	} {
		got := b.Retry(c.n, c.since)
		if got > c.hi || got < c.hi-time.Millisecond {
			t.Errorf("Retry(%d, %v) = %v, want just under %v", c.n, c.since, got, c.hi)
		}
	}
	b.Rand = func() float64 { return 0 }
	if got := b.Retry(10, time.Second); got != 5*time.Second { // equal jitter: [c/2, c]
		t.Errorf("Retry(10, 1s) with rand 0 = %v, want 5s", got)
	}
}

// After busy refusals the wait is random within a window that starts at BusyMin and
// doubles per consecutive refusal, never past the spread.
func TestBackoffBusyDelayGrowsWithinTheSpread(t *testing.T) {
	b := DefaultBackoff()
	b.Rand = func() float64 { return 0.5 }
	for k, want := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second} {
		if got := b.BusyDelay(k); got != want {
			t.Errorf("BusyDelay(%d) with rand 0.5 = %v, want %v", k, got, want)
		}
	}
	if got := b.BusyDelay(1 << 20); got != 5*time.Second { // no overflow
		t.Errorf("BusyDelay(huge) = %v, want 5s", got)
	}
	b.Rand = func() float64 { return 0 }
	if got := b.BusyDelay(3); got != 0 {
		t.Errorf("BusyDelay(3) with rand 0 = %v, want 0", got)
	}
	// Without a spread a busy refusal backs off like any failure.
	nb := Backoff{Min: time.Second, Max: time.Minute, Rand: func() float64 { return 0 }}
	if got := nb.BusyDelay(3); got != 4*time.Second {
		t.Errorf("BusyDelay(3) without a spread = %v, want 4s", got)
	}
}
