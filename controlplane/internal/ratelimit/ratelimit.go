// Package ratelimit owns per-route-group request limits (seed §8: requests per minute,
// code rate_limit_exceeded). Counters live in Redis when REDIS_URL is set, so replicas
// share them, and in memory otherwise. When Redis cannot answer, the request is not
// refused for it and api_ratelimit_fail_open_total counts it (seed §7.3 rule 6): an
// unavailable limiter must never take the API down with it. Nor may an outage switch
// limiting off: while Redis is down the replica counts in memory (Limiter.Fallback), so
// each replica still holds the limit on its own, and a Redis that failed is left alone
// for Limiter.StoreRetryInterval, so a dead or frozen one costs one bounded call per
// interval, not one per request.
package ratelimit

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
)

// Group is a set of routes sharing one limit.
type Group struct {
	Name string
	// Prefix matches the request path; the longest matching prefix wins.
	Prefix string
	// PerMinute is the number of requests a client may make in one minute window.
	PerMinute int
}

// DefaultGroups are the limits when none are configured.
func DefaultGroups() []Group {
	return []Group{
		{Name: "auth", Prefix: "/api/v1/auth/", PerMinute: 60},
		{Name: "admin", Prefix: "/api/v1/admin/", PerMinute: 600},
		{Name: "api", Prefix: "/api/", PerMinute: 1200},
		{Name: "internal", Prefix: "/internal/", PerMinute: 60},
		// The app proxy is mounted in front of the API chain, so Middleware never sees
		// its requests: the proxy counts them itself (Check) per authenticated principal,
		// not per address (a browser tab loading a notebook is one user behind one NAT
		// with many others). 12,000 a minute is 200 a second per principal.
		{Name: AppProxyGroup, Prefix: "/api/v1/app-proxy/", PerMinute: 12000},
	}
}

// AppProxyGroup is the group of the app proxy's requests.
const AppProxyGroup = "app_proxy"

// Group returns the configured group called name.
func (l *Limiter) Group(name string) (Group, bool) {
	for _, g := range l.Groups {
		if g.Name == name {
			return g, true
		}
	}
	return Group{}, false
}

// Check counts one request of client (an address, or a principal) against g and
// answers the contract's 429 (rate_limit_exceeded, details group and limit, Retry-After
// to the next window) past the limit; nil otherwise, including when no store could
// count it (fail open) or g has no limit.
func (l *Limiter) Check(ctx context.Context, g Group, client string) *apierr.Error {
	if g.PerMinute <= 0 {
		return nil
	}
	now := l.Clock.Now()
	window := now.Truncate(time.Minute)
	n, ok := l.hit(ctx, g.Name+":"+client, window, now)
	if !ok || n <= int64(g.PerMinute) {
		return nil
	}
	retry := window.Add(time.Minute).Sub(now)
	return apierr.New(apierr.RateLimitExceeded, "rate limit exceeded for %s: %d requests per minute", g.Name, g.PerMinute).
		With("group", g.Name).With("limit_per_minute", g.PerMinute).WithRetryAfter(retry)
}

// Store counts hits in fixed one-minute windows.
type Store interface {
	// Hit adds one hit to key in the window starting at window and returns the count.
	Hit(ctx context.Context, key string, window time.Time) (int64, error)
}

// Limiter is the middleware.
type Limiter struct {
	Groups []Group
	Store  Store
	Clock  clock.Clock
	// FailOpen is called for every request decided without Store (it erred, or it is
	// being left alone after an error); the request is then counted by Fallback, or
	// passes when there is none.
	FailOpen func()
	// Fallback counts while Store cannot (nil: requests pass unlimited).
	Fallback Store
	Errors   apierr.Writer
	// StoreTimeout bounds a store round trip so a hung Redis cannot stall requests.
	StoreTimeout time.Duration
	// StoreRetryInterval is how long Store is left alone after it failed (default 5s).
	StoreRetryInterval time.Duration

	mu        sync.Mutex
	downUntil time.Time // Store failed; Fallback counts until then
}

func (l *Limiter) group(path string) (Group, bool) {
	var best Group
	for _, g := range l.Groups {
		if strings.HasPrefix(path, g.Prefix) && len(g.Prefix) > len(best.Prefix) {
			best = g
		}
	}
	return best, best.Name != ""
}

// Middleware enforces the limits. Clients are keyed by remote IP: the limiter runs
// before authentication (ARCHITECTURE §3), so it also shields the token verifier.
func (l *Limiter) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g, ok := l.group(r.URL.Path)
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		if e := l.Check(r.Context(), g, ClientIP(r)); e != nil {
			l.Errors.Write(w, r, e)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// hit counts one request: in Store while it answers, else in Fallback. ok is false when
// neither could count it (the request then passes).
func (l *Limiter) hit(ctx context.Context, key string, window, now time.Time) (n int64, ok bool) {
	if l.storeUp(now) {
		ctx, cancel := context.WithTimeout(ctx, l.timeout())
		n, err := l.Store.Hit(ctx, key, window)
		cancel()
		if err == nil {
			return n, true
		}
		l.storeFailed(now)
	}
	if l.FailOpen != nil {
		l.FailOpen()
	}
	if l.Fallback == nil {
		return 0, false
	}
	n, err := l.Fallback.Hit(ctx, key, window)
	return n, err == nil
}

func (l *Limiter) storeUp(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !now.Before(l.downUntil)
}

func (l *Limiter) storeFailed(now time.Time) {
	retry := l.StoreRetryInterval
	if retry <= 0 {
		retry = 5 * time.Second
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if until := now.Add(retry); until.After(l.downUntil) {
		l.downUntil = until
	}
}

func (l *Limiter) timeout() time.Duration {
	if l.StoreTimeout > 0 {
		return l.StoreTimeout
	}
	return 250 * time.Millisecond
}

// ClientIP is the client address that limits are keyed on: the peer address, since no
// proxy header is trusted. Denial audit rows key anonymous callers on the same value.
func ClientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// Memory is an in-process store for a single replica.
type Memory struct {
	mu     sync.Mutex
	window time.Time
	counts map[string]int64
}

// NewMemory returns an empty in-memory store.
func NewMemory() *Memory { return &Memory{counts: map[string]int64{}} }

// Hit counts in the current window; older windows are dropped wholesale, which bounds
// memory by the number of distinct clients in one minute.
func (m *Memory) Hit(_ context.Context, key string, window time.Time) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !window.Equal(m.window) {
		m.window = window
		clear(m.counts)
	}
	m.counts[key]++
	return m.counts[key], nil
}
