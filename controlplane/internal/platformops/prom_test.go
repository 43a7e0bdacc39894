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

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/observability"
	"github.com/gantry-gpu/gantry/controlplane/internal/platformops"
	"github.com/gantry-gpu/gantry/loggateway/gateway"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/obs"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

// The log gateway signal and the gateway's releases entries are read from a real
// Prometheus that scraped real gateways: the signal is raised once batches are
// rejected; each distinct gateway build is one releases entry; both are unknown when
// Prometheus does not answer.
func TestLogGatewaySignalFromPrometheus(t *testing.T) {
	bin, err := exec.LookPath("prometheus")
	ci.SkipUnlessAvailable(t, "prometheus (apt-get install prometheus)", err)
	e := apitest.New(t)

	// Two real gateways of different builds, as gantry-loggateway serves them (file sink:
	// no batch is pushed here, the counters are moved directly).
	newGateway := func(version string) (*gateway.Gateway, *httptest.Server) {
		cfg := gateway.DefaultConfig()
		cfg.FilePath = filepath.Join(t.TempDir(), "logs.jsonl")
		cfg.ControlPlaneURL = e.Server.URL
		gw, err := gateway.New(cfg, gateway.Options{Version: version, Introspector: gateway.NewControlPlane(cfg.ControlPlaneURL, cfg.IntrospectTimeout)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = gw.Close() })
		srv := httptest.NewServer(gw.Handler())
		t.Cleanup(srv.Close)
		return gw, srv
	}
	gw, target := newGateway("1.4.2")
	_, older := newGateway("1.3.9")
	batches := gw.Metrics().Batches
	batches.WithLabelValues("accepted").Add(5)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	cfg := fmt.Sprintf("global: {scrape_interval: 1s}\nscrape_configs:\n  - {job_name: gantry-loggateway, static_configs: [{targets: [%q, %q]}]}\n",
		strings.TrimPrefix(target.URL, "http://"), strings.TrimPrefix(older.URL, "http://"))
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

	// Releases: each gateway build Prometheus scraped is one entry (two: mixed), with the
	// version the binary was linked with and the commit it stamped.
	gateways := func(s *platformops.Service) []api.PlatformComponentRelease {
		t.Helper()
		r, err := (&platformops.Handlers{Svc: s}).ListPlatformReleases(context.Background(), api.ListPlatformReleasesRequestObject{})
		if err != nil {
			t.Fatal(err)
		}
		var out []api.PlatformComponentRelease
		for _, c := range r.(api.ListPlatformReleases200JSONResponse).Body.Components {
			if c.Component == "loggateway" {
				out = append(out, c)
			}
		}
		return out
	}
	version := func(c api.PlatformComponentRelease) string {
		if c.Version == nil {
			return "<nil>"
		}
		return *c.Version
	}
	waitFor(t, "both gateways' build info", func() bool { return len(gateways(svc)) == 2 })
	gws := gateways(svc)
	if version(gws[0]) != "1.3.9" || version(gws[1]) != "1.4.2" || gws[0].Source != "prometheus" || gws[1].Source != "prometheus" {
		t.Fatalf("mixed gateways: %+v", gws)
	}
	// A test binary is not VCS-stamped, so the gateway exported commit "unknown": absent,
	// never the string. A stamped one must come back as it was built.
	if b := obs.ReadBuild(""); (b.Commit == "") != (gws[1].Commit == nil) || (gws[1].Commit != nil && *gws[1].Commit != b.Commit) {
		t.Fatalf("gateway commit %v, binary %+v", gws[1].Commit, b)
	}
	// The older gateway goes away: Prometheus marks its series stale and the fleet is
	// one build again.
	older.Close()
	waitFor(t, "the stopped gateway to drop out", func() bool { return len(gateways(svc)) == 1 })
	if gws := gateways(svc); version(gws[0]) != "1.4.2" {
		t.Fatalf("one gateway: %+v", gws)
	}

	// Prometheus gone: unknown, with no evidence, never a guess; the gateway's release is
	// unknown too.
	dead, _ := observability.NewPrometheus("http://127.0.0.1:1")
	deadSvc := &platformops.Service{Pool: e.Pool, Clock: e.App.Clock, ProvisioningTimeout: time.Minute, Metrics: dead}
	if s := signal(deadSvc); s.Severity != platformops.SeverityUnknown || len(s.Evidence) != 0 {
		t.Fatalf("unreachable prometheus: %+v", s)
	}
	if gws := gateways(deadSvc); len(gws) != 1 || gws[0].Source != "unknown" || gws[0].Version != nil {
		t.Fatalf("gateway release without prometheus: %+v", gws)
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
