package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/proxy"
	"github.com/gantry-gpu/gantry/controlplane/internal/ratelimit"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

// The proxy's requests are limited per principal (the app_proxy group) by the API's
// Redis-backed limiter: the limit passes, the next is 429 rate_limit_exceeded with
// Retry-After to the next window; another user is counted apart; the next window
// passes again; with Redis gone the replica keeps the limit in memory.
func TestProxyRateLimitPerPrincipal(t *testing.T) {
	w := newWorld(t)
	node := w.agentNode(t)
	_, id := w.startApp(t, node)
	rd := testenv.StartRedis(t)
	store, err := ratelimit.NewRedis("redis://"+rd.Addr(), "")
	if err != nil {
		t.Fatal(err)
	}
	// Mid-window, so Retry-After is the rest of the minute.
	clk := clock.NewManual(time.Date(2026, 11, 26, 4, 0, 15, 0, time.UTC))
	const limit = 3
	var failOpen atomic.Int64
	lim := &ratelimit.Limiter{Groups: []ratelimit.Group{{Name: ratelimit.AppProxyGroup, Prefix: proxy.Prefix, PerMinute: limit}},
		Store: store, Fallback: ratelimit.NewMemory(), Clock: clk, FailOpen: func() { failOpen.Add(1) }}
	p := w.newProxyWith(t, w.App, proxy.Config{AccessCacheTTL: -1}, w.App.Clock, func(d *proxy.Deps) { d.Limiter = lim })
	srv := httptest.NewServer(p.Mount(w.App.Handler))
	t.Cleanup(func() { p.Close(); srv.CloseClientConnections(); srv.Close() })
	hello := srv.URL + proxy.InstancePath(id) + "hello"
	status := func(tok string) int {
		resp := do(t, http.DefaultClient, http.MethodGet, hello, tok, nil)
		resp.Body.Close()
		return resp.StatusCode
	}
	refused := func(tok, when string) {
		t.Helper()
		resp := do(t, http.DefaultClient, http.MethodGet, hello, tok, nil)
		retry := resp.Header.Get("Retry-After")
		env := wantEnvelope(t, resp, 429, "rate_limit_exceeded")
		if retry != "45" || env.Details["group"] != ratelimit.AppProxyGroup || env.Details["limit_per_minute"] != float64(limit) {
			t.Errorf("%s: Retry-After %q, details %v", when, retry, env.Details)
		}
	}
	alice := w.Acme.AdminToken
	for i := 1; i <= limit; i++ {
		if got := status(alice); got != 200 {
			t.Fatalf("request %d: %d", i, got)
		}
	}
	refused(alice, "past the limit")
	// Another principal of the same project has its own count.
	bob := w.member(t, "member")
	if got := status(bob); got != 200 {
		t.Fatalf("another user: %d", got)
	}
	// The next window.
	clk.Advance(time.Minute)
	if got := status(alice); got != 200 {
		t.Fatalf("next window: %d", got)
	}
	if failOpen.Load() != 0 {
		t.Fatalf("%d requests decided without Redis while it ran", failOpen.Load())
	}
	// Redis gone: counted in memory, the limit still holds.
	rd.Stop()
	clk.Advance(time.Minute)
	for i := 1; i <= limit; i++ {
		if got := status(alice); got != 200 {
			t.Fatalf("without Redis, request %d: %d", i, got)
		}
	}
	refused(alice, "without Redis, past the limit")
	if failOpen.Load() == 0 {
		t.Fatal("the outage was not counted as fail-open")
	}
}
