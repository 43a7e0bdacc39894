package proxy_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/proxy"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// recordingMeter is the Meter seam as shared runtimes implement it, reduced to what the
// proxy decides: which calls reach it, and what a refusal does to the answer.
type recordingMeter struct {
	mu     sync.Mutex
	calls  []proxy.Call
	refuse bool
}

func (m *recordingMeter) ProxiedCall(_ context.Context, c proxy.Call) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.refuse {
		return apierr.Forbidden("the project is not attached to this shared runtime")
	}
	m.calls = append(m.calls, c)
	return nil
}

func (m *recordingMeter) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.calls)
}

// Only calls the app answered with a billable status (< 500) are metered, once each
// with their own call id; the proxy's own 502/503 and the app's 5xx are not; a meter
// refusal withholds the app's answer.
func TestProxyMetersOnlyAnsweredCalls(t *testing.T) {
	w := newWorld(t)
	node := w.agentNode(t)
	_, id := w.startApp(t, node)
	m := &recordingMeter{}
	p := w.newProxyWith(t, w.App, proxy.Config{AccessCacheTTL: -1}, w.App.Clock, func(d *proxy.Deps) { d.Meter = m })
	srv := httptest.NewServer(p.Mount(w.App.Handler))
	t.Cleanup(func() { p.Close(); srv.CloseClientConnections(); srv.Close() })
	tok := w.Acme.AdminToken
	get := func(url string) (int, string) {
		resp := do(t, http.DefaultClient, http.MethodGet, url, tok, nil)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	base := srv.URL + proxy.InstancePath(id)

	if st, _ := get(base + "hello"); st != 200 {
		t.Fatalf("hello: %d", st)
	}
	if st, _ := get(base + "nowhere"); st != 404 { // the app's own 404: answered, billable
		t.Fatalf("nowhere: %d", st)
	}
	if n := m.count(); n != 2 {
		t.Fatalf("%d calls metered after a 200 and an app 404, want 2", n)
	}
	m.mu.Lock()
	if m.calls[0].CallID == m.calls[1].CallID || m.calls[0].Target.InstanceID != id {
		t.Errorf("calls %+v", m.calls)
	}
	m.mu.Unlock()

	// The app's 500: not metered.
	if st, _ := get(base + "fail"); st != 500 {
		t.Fatalf("fail: %d", st)
	}
	// The app's port refuses connections: the proxy's 502, not metered.
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	deadAddr := dead.Addr().String()
	_ = dead.Close()
	down := w.instance(t, node, deadAddr, "running", "")
	if st, _ := get(srv.URL + proxy.InstancePath(down) + "x"); st != 502 {
		t.Fatalf("down: %d", st)
	}
	// Not running: the proxy's 503, not metered.
	w.setState(t, id, "stopping")
	if st, _ := get(base + "hello"); st != 503 {
		t.Fatalf("stopping: %d", st)
	}
	w.setState(t, id, "running")
	if n := m.count(); n != 2 {
		t.Fatalf("%d calls metered, want still 2 (500, 502 and 503 are not billed)", n)
	}

	// A refusal of the meter (the project was detached meanwhile): the app's body is
	// withheld and the caller gets the refusal's envelope.
	m.mu.Lock()
	m.refuse = true
	m.mu.Unlock()
	resp := do(t, http.DefaultClient, http.MethodGet, base+"hello", tok, nil)
	env := wantEnvelope(t, resp, 403, "insufficient_permissions")
	if env.Details["route"] != proxy.Route {
		t.Errorf("refusal details %v", env.Details)
	}
}
