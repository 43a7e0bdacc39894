package server_test

import (
	"net/http/httptest"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
)

// BenchmarkHealthChain measures the chain in-process (no network), for profiling:
// go test -run X -bench HealthChain -cpuprofile cpu.out ./controlplane/internal/server/
func BenchmarkHealthChain(b *testing.B) {
	e := apitest.New(b, apitest.WithConfig(func(c *appConfig) { c.RateLimits = "api=0" }))
	h := e.App.Handler
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/api/v1/health", nil))
	}
}
