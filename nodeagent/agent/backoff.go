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
	// Spread is the window for the first reconnect after an established tunnel ended
	// in a way the whole fleet saw at the same moment (fabricnet.FleetWideEnd: the
	// control plane closed it in a graceful stop, or, on TLS+yamux, its connection
	// ended): that retry waits a uniformly random time in [0, Spread), so 10,000 agents
	// do not hand a restarted control plane 10,000 handshakes within Min. After a
	// crash on QUIC the agents learn of it one by one (stateless reset, idle timeout)
	// and retry after Delay(0) as after any other end.
	Spread time.Duration
	// RecentMax caps the backoff, instead of Max, for attempts within RecentWindow of
	// the end of an established tunnel. The control plane was there a moment ago: it is
	// restarting or shedding load, and an agent that escalated to a 30 s wait while it
	// was saturated comes back long after the storm has passed (the graceful restart of
	// 10,000 agents, docs/fabric.md). Zero: no cap.
	RecentMax    time.Duration
	RecentWindow time.Duration
	// BusyMin is the first window of BusyDelay (zero: the whole Spread).
	BusyMin time.Duration
	// Rand returns a uniform value in [0, 1). nil means math/rand/v2.
	Rand func() float64
}

// DefaultBackoff is 500 ms doubling to 30 s (10 s within 2 minutes of an established
// tunnel's end), a 10 s spread after a fleet-wide end, and after busy refusals a random
// wait within 1 s, 2 s, 4 s, 8 s, then 10 s.
func DefaultBackoff() Backoff {
	return Backoff{Min: 500 * time.Millisecond, Max: 30 * time.Second, Spread: 10 * time.Second,
		RecentMax: 10 * time.Second, RecentWindow: 2 * time.Minute, BusyMin: time.Second}
}

// Retry is how long to wait after failed attempt n (0-based). sinceEstablished is how
// long ago the agent's last established tunnel ended (negative: it never had one):
// within RecentWindow of it the ceiling is RecentMax.
func (b Backoff) Retry(n int, sinceEstablished time.Duration) time.Duration {
	if b.RecentMax > 0 && sinceEstablished >= 0 && sinceEstablished < b.RecentWindow {
		capped := b
		capped.Max = min(b.Max, b.RecentMax)
		return capped.Delay(n)
	}
	return b.Delay(n)
}

// BusyDelay is how long to wait after the k-th consecutive attempt (0-based) that the
// control plane refused because it was busy (fabricnet.ServerBusy): a uniformly random
// time in [0, min(BusyMin·2^k, Spread)). The refusal cost the server a packet and it
// admits again as soon as handshakes complete, so the first retries come soon; the
// window grows while the refusals go on, never past the spread, and the attempt counter
// of Retry does not move: an agent refused during a storm is not pushed toward 30 s,
// and the fleet's retries stay random (no synchronised wave). Without a Spread, Delay(k).
func (b Backoff) BusyDelay(k int) time.Duration {
	if b.Spread <= 0 {
		return b.Delay(k)
	}
	w := b.BusyMin
	if w <= 0 {
		w = b.Spread
	}
	for range k {
		if w >= b.Spread {
			break
		}
		w *= 2
	}
	w = min(w, b.Spread)
	r := b.Rand
	if r == nil {
		r = rand.Float64
	}
	return time.Duration(r() * float64(w))
}

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

// SpreadDelay is how long to wait before the first reconnect after a fleet-wide end (see
// Spread); Delay(0) when Spread is not set.
func (b Backoff) SpreadDelay() time.Duration {
	if b.Spread <= 0 {
		return b.Delay(0)
	}
	r := b.Rand
	if r == nil {
		r = rand.Float64
	}
	return time.Duration(r() * float64(b.Spread))
}
