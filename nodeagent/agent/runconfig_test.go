package agent_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grafana/loki/pkg/push"
	"github.com/klauspost/compress/snappy"

	"github.com/gantry-gpu/gantry/nodeagent/agent"
	"github.com/gantry-gpu/gantry/nodeagent/config"
)

// TestRunConfigConnectsAndShipsLogs runs the agent the way `gantry-nodeagent run` does,
// from an enrolled configuration on disk, with a log gateway configured: it connects
// with the mock H100s seeded by the node id, and its own log records reach the gateway
// in the Loki push format with the node token.
func TestRunConfigConnectsAndShipsLogs(t *testing.T) {
	p := newPeer(t, nil)
	var mu sync.Mutex
	var lines []string
	var auth string
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		raw, err := snappy.Decode(nil, body)
		var req push.PushRequest
		if err == nil {
			err = req.Unmarshal(raw)
		}
		if err != nil || r.URL.Path != "/loki/api/v1/push" {
			http.Error(w, "bad push", http.StatusBadRequest)
			return
		}
		mu.Lock()
		auth = r.Header.Get("Authorization")
		for _, s := range req.Streams {
			for _, e := range s.Entries {
				lines = append(lines, e.Line)
			}
		}
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer gw.Close()

	cfg := config.Default()
	cfg.Path = filepath.Join(t.TempDir(), "nodeagent.conf")
	cfg.NodeID, cfg.FabricAddr, cfg.FabricServerName = "0190f6a0-0000-7000-8000-0000000000aa", p.addr(), "localhost"
	cfg.GPUBackend, cfg.Hostname, cfg.LogGatewayURL = "mock-h100", "gpu-runconfig", gw.URL
	if err := cfg.WriteToken(p.token); err != nil {
		t.Fatal(err)
	}
	if err := cfg.WriteCA(p.caPEM); err != nil {
		t.Fatal(err)
	}
	if err := config.Save(cfg.Path, cfg); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(cfg.Path, false, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.RunConfig(ctx, cfg, "test-run", slog.New(slog.DiscardHandler)) }()
	p.waitFor("hello from the configured agent", func() bool { return len(p.hellos) == 1 })
	if h := p.hellos[0]; h.GetHostname() != "gpu-runconfig" || len(h.GetInventory().GetGpus()) != 8 {
		t.Fatalf("hello %v", h)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		got := strings.Join(lines, "\n")
		a := auth
		mu.Unlock()
		if strings.Contains(got, "fabric tunnel up") {
			if a != "Bearer "+p.token {
				t.Fatalf("push authorization %q", a)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent logs never reached the gateway; got:\n%s", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
