package agent

import (
	"math/rand/v2"
	"time"
)

// Backoff spaces out reconnect attempts: exponential from Min, capped at Max, with
// "equal jitter" — attempt n waits a uniformly random time in [c/2, c] where
// c = min(Min·2ⁿ, Max). The lower half keeps a flapping link from hammering the control
// plane; the random upper half spreads a whole fleet that lost the same control plane at
// the same moment, so it does not come back in one synchronised wave.
type Backoff struct {
	Min time.Duration
	Max time.Duration
	// Rand returns a uniform value in [0, 1). nil means math/rand/v2.
	Rand func() float64
}

// DefaultBackoff is 500 ms doubling to 30 s.
func DefaultBackoff() Backoff { return Backoff{Min: 500 * time.Millisecond, Max: 30 * time.Second} }

// Ceiling is the most attempt n can wait: min(Min·2ⁿ, Max).
func (b Backoff) Ceiling(n int) time.Duration {
	c := b.Min
	for range n {
		if c >= b.Max/2 {
			return b.Max
		}
		c *= 2
	}
	return min(c, b.Max)
}

// Delay is how long to wait before reconnect attempt n (0 for the first retry after a
// session ended).
func (b Backoff) Delay(n int) time.Duration {
	c := b.Ceiling(n)
	r := b.Rand
	if r == nil {
		r = rand.Float64
	}
	half := c / 2
	return half + time.Duration(r()*float64(c-half))
}
