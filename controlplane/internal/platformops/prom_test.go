package platformops_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/observability"
	"github.com/gantry-gpu/gantry/controlplane/internal/platformops"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

// The log gateway signal is read from a real Prometheus that scraped the gateway's
// counter: raised once batches are rejected, unknown when Prometheus does not answer.
func TestLogGatewaySignalFromPrometheus(t *testing.T) {
	bin, err := exec.LookPath("prometheus")
	ci.SkipUnlessAvailable(t, "prometheus (apt-get install prometheus)", err)
	e := apitest.New(t)

	// The gateway's counter, as gantry-loggateway exposes it.
	reg := prometheus.NewRegistry()
	batches := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "node_log_gateway_batches_total", Help: "batches"}, []string{"outcome"})
	reg.MustRegister(batches)
	batches.WithLabelValues("accepted").Add(5)
	batches.WithLabelValues("rejected_auth").Add(0)
	target := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(target.Close)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	cfg := fmt.Sprintf("global: {scrape_interval: 1s}\nscrape_configs:\n  - {job_name: gantry-loggateway, static_configs: [{targets: [%q]}]}\n",
		strings.TrimPrefix(target.URL, "http://"))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus:\n%s", out.String())
		}
	})
	prom, err := observability.NewPrometheus("http://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	svc := &platformops.Service{Pool: e.Pool, Clock: e.App.Clock, ProvisioningTimeout: 10 * time.Minute, Metrics: prom}
	signal := func(s *platformops.Service) platformops.Signal {
		t.Helper()
		sigs, _, err := s.Signals(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range sigs {
			if x.Key == "log_gateway_rejections" {
				return x
			}
		}
		t.Fatal("no log_gateway_rejections signal")
		return platformops.Signal{}
	}
	// Wait (bounded, nothing timed) until Prometheus has scraped the quiet gateway.
	waitFor(t, "a scrape of the gateway", func() bool {
		v, err := prom.Scalar(context.Background(), `sum(node_log_gateway_batches_total)`, time.Now())
		return err == nil && v != nil && *v == 5
	})
	if s := signal(svc); s.Severity != platformops.SeverityOK || len(s.Evidence) != 1 || s.Evidence[0].Source != "metrics" {
		t.Fatalf("quiet gateway: %+v", s)
	}
	batches.WithLabelValues("rejected_auth").Add(3)
	batches.WithLabelValues("rejected_size").Add(2)
	waitFor(t, "the rejections to be scraped", func() bool { return signal(svc).Severity == platformops.SeverityWarning })
	if s := signal(svc); s.Count < 1 || s.RunbookID != "ops.loggateway.rejections" || s.Evidence[0].QueryID != platformops.LogGatewayRejectionsQuery {
		t.Fatalf("rejecting gateway: %+v", s)
	}

	// Prometheus gone: unknown, with no evidence, never a guess.
	dead, _ := observability.NewPrometheus("http://127.0.0.1:1")
	if s := signal(&platformops.Service{Pool: e.Pool, Clock: e.App.Clock, ProvisioningTimeout: time.Minute, Metrics: dead}); s.Severity != platformops.SeverityUnknown || len(s.Evidence) != 0 {
		t.Fatalf("unreachable prometheus: %+v", s)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second) // bounds a broken run only
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
