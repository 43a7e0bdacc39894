package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/proxy"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/clock"
)

// An admission is reused for AccessCacheTTL (the instance stopping is not seen), and
// read again after it (the stop is seen); a refusal is never reused.
func TestProxyAdmissionCache(t *testing.T) {
	w := newWorld(t)
	node := w.agentNode(t)
	_, id := w.startApp(t, node)
	clk := clock.NewManual(time.Now())
	p := w.newProxy(t, w.App, proxy.Config{AccessCacheTTL: time.Second}, clk)
	srv := httptest.NewServer(p.Mount(w.App.Handler))
	t.Cleanup(func() { p.Close(); srv.CloseClientConnections(); srv.Close() })
	hello := srv.URL + proxy.InstancePath(id) + "hello"
	tok := w.Acme.AdminToken
	get := func() int {
		resp := do(t, http.DefaultClient, http.MethodGet, hello, tok, nil)
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get(); got != 200 {
		t.Fatalf("first: %d", got)
	}
	w.setState(t, id, "stopped")
	clk.Advance(999 * time.Millisecond)
	if got := get(); got != 200 {
		t.Fatalf("within the TTL: %d, want the cached admission (200)", got)
	}
	clk.Advance(time.Millisecond)
	if got := get(); got != 503 {
		t.Fatalf("after the TTL: %d, want 503", got)
	}
	// A refusal is not cached: a new member gets in at once.
	outsiderID, outsider := w.NewUser(t, w.Acme.AdminToken, "member")
	w.setState(t, id, "running")
	clk.Advance(2 * time.Second)
	wantEnvelope(t, do(t, http.DefaultClient, http.MethodGet, hello, outsider, nil), 403, "insufficient_permissions")
	if r, err := w.Client(w.Acme.AdminToken).AddProjectMemberWithResponse(t.Context(), w.Acme.DefaultProject, &api.AddProjectMemberParams{},
		api.AddProjectMemberRequest{UserID: outsiderID, Role: "member"}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("add member: %v", err)
	}
	resp := do(t, http.DefaultClient, http.MethodGet, hello, outsider, nil)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("new member: %d", resp.StatusCode)
	}
}
