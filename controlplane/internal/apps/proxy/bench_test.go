package proxy_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/proxy"
)

// BenchmarkProxySmallGET is one small GET through the proxy (bearer token, admission
// cache as deployed, kept-alive fabric streams) to a real app on a real agent, for CPU
// and allocation profiles of the per-request path (`-cpuprofile`, `-benchmem`). It
// reports no verdict; gantry-bench's appproxy run compares against the direct path.
func BenchmarkProxySmallGET(b *testing.B) {
	w := newWorld(b)
	node := w.agentNode(b)
	_, id := w.startApp(b, node)
	p := w.newProxy(b, w.App, proxy.Config{}, w.App.Clock)
	srv := httptest.NewServer(p.Mount(w.App.Handler))
	b.Cleanup(func() { p.Close(); srv.CloseClientConnections(); srv.Close() })
	url := srv.URL + proxy.InstancePath(id) + "hello"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+w.Acme.AdminToken)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
}
