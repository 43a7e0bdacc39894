package health_test

import (
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/proto/openapi"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func get(t *testing.T, e *apitest.Env, path, token string) (int, []byte) {
	t.Helper()
	resp := e.Do(e.Request("GET", path, token, ""))
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, b
}

func TestHealthReadinessDocumentStats(t *testing.T) {
	e := apitest.New(t)
	if s, b := get(t, e, "/api/v1/health", ""); s != 200 || !strings.Contains(string(b), `"ok":true`) {
		t.Fatalf("health %d %s", s, b)
	}
	if s, b := get(t, e, "/readyz", ""); s != 200 || !strings.Contains(string(b), `"ok":true`) {
		t.Fatalf("readyz %d %s", s, b)
	}
	if s, b := get(t, e, "/api/v1/openapi.yaml", ""); s != 200 || string(b) != string(openapi.Document) {
		t.Fatalf("document %d (%d bytes)", s, len(b))
	}

	_, adminTok := e.PlatformAdmin(t)
	ten := e.NewTenant(t, adminTok, "Stats")
	s, b := get(t, e, "/api/v1/internal/stats", adminTok)
	var stats api.InternalStatsResponse
	if s != 200 || json.Unmarshal(b, &stats) != nil || stats.Tenants != 1 || stats.Users != 2 || stats.Projects != 1 {
		t.Fatalf("stats %d %s", s, b)
	}
	if s, _ := get(t, e, "/api/v1/internal/stats", ten.AdminToken); s != 403 {
		t.Fatalf("stats without platform.ops.read: %d", s)
	}

	// NATS gone: not ready.
	e.App.NATS.Close()
	if s, b := get(t, e, "/readyz", ""); s != 503 || !strings.Contains(string(b), `"nats":"down"`) || !strings.Contains(string(b), `"postgres":"ok"`) {
		t.Fatalf("readyz without nats: %d %s", s, b)
	}
}
