// Package ratelimit owns per-route-group request limits (seed §8: requests per minute,
// code rate_limit_exceeded). Counters live in Redis when REDIS_URL is set, so replicas
// share them, and in memory otherwise. When Redis cannot answer, the request passes and
// api_ratelimit_fail_open_total counts it (seed §7.3 rule 6): an unavailable limiter must
// never take the API down with it.
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
	}
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
	// FailOpen is called when the store errs; the request then passes.
	FailOpen func()
	Errors   apierr.Writer
	// StoreTimeout bounds a store round trip so a hung Redis cannot stall requests.
	StoreTimeout time.Duration
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
		if !ok || g.PerMinute <= 0 {
			next.ServeHTTP(w, r)
			return
		}
		now := l.Clock.Now()
		window := now.Truncate(time.Minute)
		ctx, cancel := context.WithTimeout(r.Context(), l.timeout())
		n, err := l.Store.Hit(ctx, g.Name+":"+clientIP(r), window)
		cancel()
		if err != nil {
			if l.FailOpen != nil {
				l.FailOpen()
			}
			next.ServeHTTP(w, r)
			return
		}
		if n > int64(g.PerMinute) {
			retry := window.Add(time.Minute).Sub(now)
			l.Errors.Write(w, r, apierr.New(apierr.RateLimitExceeded, "rate limit exceeded for %s: %d requests per minute", g.Name, g.PerMinute).
				With("group", g.Name).With("limit_per_minute", g.PerMinute).WithRetryAfter(retry))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (l *Limiter) timeout() time.Duration {
	if l.StoreTimeout > 0 {
		return l.StoreTimeout
	}
	return 250 * time.Millisecond
}

func clientIP(r *http.Request) string {
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
