package nodemetrics_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodemetrics"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/nodeagent/agent"
	"github.com/gantry-gpu/gantry/nodeagent/gpu"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

const waitLimit = 30 * time.Second

func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type okDialer struct{}

func (okDialer) DialContext(context.Context, string, string) (net.Conn, error) {
	c1, c2 := net.Pipe()
	_ = c2.Close()
	return c1, nil
}

// staticGPU is one healthy H100 at 42 °C.
type staticGPU struct{ uuid string }

func (g staticGPU) Name() string { return "static" }
func (g staticGPU) Inventory(context.Context) (gpu.Inventory, error) {
	return gpu.Inventory{DriverVersion: "550.54.15", CUDAVersion: "12.4", GPUs: []gpu.GPU{{
		Index: 0, UUID: g.uuid, Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 81920 << 20, PCIBusID: "0000:18:00.0",
	}}}, nil
}
func (g staticGPU) Sample(context.Context) ([]gpu.Metrics, error) {
	return []gpu.Metrics{{UUID: g.uuid, Healthy: true, TemperatureC: 42, UtilizationPercent: 77, SampledAt: time.Now()}}, nil
}
func (g staticGPU) Close() error { return nil }

type world struct {
	*apitest.Env
	token string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	tokenFile := filepath.Join(t.TempDir(), "node-metrics.token")
	const token = "node-metrics-test-token-0123456789"
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := apitest.New(t,
		apitest.WithOptions(func(o *app.Options) { o.NodeProbeDialer = okDialer{} }),
		apitest.WithConfig(func(c *app.Config) {
			c.Fabric.ReplicaID = "ra"
			c.NodeMetrics.TokenFile = tokenFile
			c.NodeMetrics.Timeout = 5 * time.Second
		}))
	runFabric(t, e.App)
	return &world{Env: e, token: token}
}

func runFabric(t *testing.T, a *app.App) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Fabric.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	wctx, wcancel := context.WithTimeout(ctx, waitLimit)
	defer wcancel()
	if err := a.Fabric.WaitPresence(wctx); err != nil {
		t.Fatal(err)
	}
}

// agentNode enrolls a node and runs a real node agent against the fabric until stop.
func (w *world) agentNode(t *testing.T) (uuid.UUID, context.CancelFunc, chan struct{}) {
	t.Helper()
	ctx := context.Background()
	n, err := w.App.Nodes.Create(ctx, nodes.Spec{Name: "gpu-" + uuid.NewString()[:8], Address: "10.9.0.7"})
	if err != nil {
		t.Fatal(err)
	}
	et, err := w.App.Nodes.IssueEnrollmentToken(ctx, n.ID)
	if err != nil {
		t.Fatal(err)
	}
	en, err := w.App.Nodes.Enroll(ctx, et.Token, "gpu-host", "test/1")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(w.App.Fabric.CAPEM())
	ag, err := agent.New(agent.Options{
		Addr: w.App.Fabric.ListenAddr().String(), Transport: fabricnet.ModeTCP, TLS: &tls.Config{RootCAs: pool},
		Token: func() (string, error) { return en.NodeToken, nil }, AgentVersion: "1.7.0", AgentCommit: "c0ffee1", Hostname: "gpu-host",
		GPU:     staticGPU{uuid: "GPU-" + n.ID.String()},
		Backoff: agent.Backoff{Min: 50 * time.Millisecond, Max: 500 * time.Millisecond},
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = ag.Run(actx) }()
	t.Cleanup(func() { cancel(); <-done })
	eventually(t, "the node online", func() bool {
		got, err := w.App.Nodes.Get(ctx, n.ID)
		return err == nil && got.Status == nodes.StatusOnline && ag.Status().Connected && ag.Status().TelemetrySent > 0
	})
	return n.ID, cancel, done
}

// get answers path; a JSON array (service discovery) is left in Raw only.
func (w *world) get(t *testing.T, path, token string) apitest.Answer {
	t.Helper()
	resp := w.Do(w.Request("GET", path, token, ""))
	defer resp.Body.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		t.Fatal(err)
	}
	a := apitest.Answer{Status: resp.StatusCode, Header: resp.Header, Body: map[string]any{}, Raw: buf.String()}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") && strings.HasPrefix(a.Raw, "{") {
		if err := json.Unmarshal(buf.Bytes(), &a.Body); err != nil {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, a.Raw)
		}
	}
	return a
}

func TestNodeMetricsThroughTheFabric(t *testing.T) {
	w := newWorld(t)
	nodeID, stop, stopped := w.agentNode(t)
	path := nodemetrics.MetricsPath(nodeID)

	// Service discovery lists the online node, scraped through this control plane.
	sd := w.get(t, "/api/v1/internal/metrics/nodes", w.token)
	if sd.Status != 200 {
		t.Fatalf("targets: %d %s", sd.Status, sd.Raw)
	}
	host := strings.TrimPrefix(w.Server.URL, "http://")
	want := fmt.Sprintf(`[{"labels":{"__metrics_path__":%q,"node_id":%q},"targets":[%q]}]`, path, nodeID, host)
	if got := strings.TrimSpace(sd.Raw); got != want {
		t.Fatalf("targets:\n got %s\nwant %s", got, want)
	}

	res := w.get(t, path, w.token)
	if res.Status != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("metrics: %d %s %s", res.Status, res.Header.Get("Content-Type"), res.Raw)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(strings.NewReader(res.Raw))
	if err != nil {
		t.Fatalf("exposition: %v\n%s", err, res.Raw)
	}
	for _, name := range []string{"gantry_nodeagent_build_info", "gantry_nodeagent_tunnel_connected", "gantry_nodeagent_gpu_temperature_celsius", "go_goroutines"} {
		mf := mfs[name]
		if mf == nil || len(mf.GetMetric()) == 0 {
			t.Fatalf("%s missing from\n%s", name, res.Raw)
		}
		for _, m := range mf.GetMetric() {
			var node string
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "node_id" {
					node = lp.GetValue()
				}
			}
			if node != nodeID.String() {
				t.Fatalf("%s sample without node_id=%s: %v", name, nodeID, m)
			}
		}
	}
	for _, line := range []string{
		fmt.Sprintf(`gantry_nodeagent_build_info{commit="c0ffee1",node_id="%s",version="1.7.0"} 1`, nodeID),
		fmt.Sprintf(`gantry_nodeagent_tunnel_connected{node_id="%s",transport="tcp"} 1`, nodeID),
	} {
		if !strings.Contains(res.Raw, line+"\n") {
			t.Fatalf("missing %q in\n%s", line, res.Raw)
		}
	}
	if !strings.Contains(res.Raw, "gantry_nodeagent_gpu_temperature_celsius{gpu_index=\"0\",gpu_uuid=\"GPU-"+nodeID.String()+"\",model=\"NVIDIA H100 80GB HBM3\",node_id=\""+nodeID.String()+"\"} 42\n") {
		t.Fatalf("GPU temperature not scraped:\n%s", res.Raw)
	}

	// The token: missing, wrong.
	for _, tok := range []string{"", "wrong-token"} {
		for _, p := range []string{path, "/api/v1/internal/metrics/nodes"} {
			if a := w.get(t, p, tok); a.Status != 401 || a.Code() != "token_invalid" {
				t.Fatalf("%s with token %q: %d %s", p, tok, a.Status, a.Raw)
			}
		}
	}
	// A malformed node id.
	if a := w.get(t, "/api/v1/internal/metrics/nodes/not-a-uuid", w.token); a.Status != 422 || a.Code() != "validation_error" {
		t.Fatalf("bad id: %d %s", a.Status, a.Raw)
	}
	// A node nobody holds a tunnel for.
	if a := w.get(t, nodemetrics.MetricsPath(uuid.New()), w.token); a.Status != 503 || a.Code() != "service_unavailable" || a.Reason() != nodemetrics.ReasonNodeOffline {
		t.Fatalf("unknown node: %d %s", a.Status, a.Raw)
	}

	// The agent stops: its tunnel is gone (presence keeps the node online until its TTL,
	// so a reconnect is no status change), and the scrape is 503 node_offline, which
	// Prometheus records as the target down.
	stop()
	<-stopped
	eventually(t, "the scrape of a stopped agent refused", func() bool {
		a := w.get(t, path, w.token)
		if a.Status == 200 {
			return false
		}
		if a.Status != 503 || a.Code() != "service_unavailable" || a.Reason() != nodemetrics.ReasonNodeOffline {
			t.Fatalf("stopped agent: %d %s", a.Status, a.Raw)
		}
		return true
	})
	if w.Validated.Load() < 9 { // every answer above
		t.Fatalf("only %d responses validated against the contract", w.Validated.Load())
	}
}

// pipeFabric hands out one end of a pipe whose other end serve drives: a stand-in for an
// agent that accepted the stream and then misbehaves.
type pipeFabric struct {
	serve func(net.Conn)
}

func (f pipeFabric) OpenStream(context.Context, uuid.UUID, *fabricv1.StreamPreamble) (net.Conn, error) {
	a, b := net.Pipe()
	go f.serve(b)
	return a, nil
}
func (pipeFabric) AllPresence(context.Context) (map[uuid.UUID]fleet.Presence, error) {
	return map[uuid.UUID]fleet.Presence{
		uuid.MustParse("00000000-0000-4000-8000-000000000002"): {Online: true, Replica: "rb"},
		uuid.MustParse("00000000-0000-4000-8000-000000000001"): {Online: true, Replica: "ra"},
		uuid.MustParse("00000000-0000-4000-8000-000000000003"): {Online: false, Replica: "ra"},
	}, nil
}
func (pipeFabric) ReplicaID() string { return "ra" }

func TestScrapeBounded(t *testing.T) {
	hold := make(chan struct{})
	defer close(hold)
	cases := []struct {
		name    string
		timeout time.Duration
		serve   func(net.Conn)
		reason  string
	}{
		{"agent says nothing", 300 * time.Millisecond, func(c net.Conn) { <-hold; _ = c.Close() }, nodemetrics.ReasonTimeout},
		{"agent sends more than the limit", waitLimit, func(c net.Conn) {
			defer c.Close()
			line := []byte("# a comment line that pads the exposition out past the limit\n")
			for i := 0; i < nodemetrics.MaxBytes/len(line)+2; i++ {
				if _, err := c.Write(line); err != nil {
					return
				}
			}
		}, nodemetrics.ReasonTooLarge},
		{"agent sends garbage", waitLimit, func(c net.Conn) { _, _ = c.Write([]byte("this is { not an exposition\n")); _ = c.Close() }, nodemetrics.ReasonBadMetrics},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := &nodemetrics.Scraper{Fabric: pipeFabric{serve: c.serve}, Timeout: c.timeout}
			_, err := s.Scrape(context.Background(), uuid.New())
			var se *nodemetrics.ScrapeError
			if !errors.As(err, &se) || se.Reason != c.reason {
				t.Fatalf("err = %v, want reason %s", err, c.reason)
			}
		})
	}
}

func TestRelabelOverwritesNodeID(t *testing.T) {
	in := "# TYPE x gauge\nx{node_id=\"forged\",a=\"b\"} 3\n# TYPE y_total counter\ny_total 2\n"
	out, err := nodemetrics.Relabel([]byte(in), "n-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`x{a="b",node_id="n-1"} 3`, `y_total{node_id="n-1"} 2`} {
		if !bytes.Contains(out, []byte(want+"\n")) {
			t.Fatalf("missing %s in\n%s", want, out)
		}
	}
	if bytes.Contains(out, []byte("forged")) {
		t.Fatalf("agent's node_id kept:\n%s", out)
	}
}

func TestTargetsListOnlineNodesInOrder(t *testing.T) {
	groups, err := nodemetrics.Targets(context.Background(), pipeFabric{}, "cp.internal:8080")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(groups)
	want := `[{"labels":{"__metrics_path__":"/api/v1/internal/metrics/nodes/00000000-0000-4000-8000-000000000001","node_id":"00000000-0000-4000-8000-000000000001"},"targets":["cp.internal:8080"]},` +
		`{"labels":{"__metrics_path__":"/api/v1/internal/metrics/nodes/00000000-0000-4000-8000-000000000002","node_id":"00000000-0000-4000-8000-000000000002"},"targets":["cp.internal:8080"]}]`
	if string(got) != want {
		t.Fatalf("targets:\n got %s\nwant %s", got, want)
	}
}

// A replica that does not hold the node's tunnel asks the holder over NATS: Prometheus
// may reach any replica behind the load balancer.
func TestNodeMetricsThroughAnotherReplica(t *testing.T) {
	w := newWorld(t)
	nodeID, _, _ := w.agentNode(t)

	cfg := w.App.Config
	cfg.Fabric.ReplicaID = "rb"
	cfg.Fabric.Addr = "127.0.0.1:0"
	b, err := app.New(context.Background(), cfg, slog.New(slog.DiscardHandler), app.Options{Pool: w.Pool, NodeProbeDialer: okDialer{}})
	if err != nil {
		t.Fatalf("second replica: %v", err)
	}
	t.Cleanup(b.Close)
	runFabric(t, b)
	srv := httptest.NewServer(b.Handler)
	t.Cleanup(srv.Close)
	eventually(t, "replica rb sees the node online", func() bool {
		p, ok, err := b.Fabric.Presence(context.Background(), nodeID)
		return err == nil && ok && p.Online && p.Replica == "ra"
	})

	req, err := http.NewRequest("GET", srv.URL+nodemetrics.MetricsPath(nodeID), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+w.token)
	resp, err := w.HTTPClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	line := fmt.Sprintf(`gantry_nodeagent_build_info{commit="c0ffee1",node_id="%s",version="1.7.0"} 1`, nodeID)
	if resp.StatusCode != 200 || !strings.Contains(body.String(), line+"\n") {
		t.Fatalf("through replica rb: %d\n%s", resp.StatusCode, body.String())
	}
}

// A real Prometheus discovers the node through the control plane's HTTP SD endpoint and
// scrapes its agent through the fabric, as deploy/prometheus's gantry-nodeagent job does.
func TestPrometheusScrapesNodeThroughControlPlane(t *testing.T) {
	promBin, err := exec.LookPath("prometheus")
	ci.SkipUnlessAvailable(t, "prometheus (apt-get install prometheus)", err)
	w := newWorld(t)
	nodeID, _, _ := w.agentNode(t)

	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "node-metrics.token")
	if err := os.WriteFile(tokenFile, []byte(w.token), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	promAddr := ln.Addr().String()
	_ = ln.Close()
	cfg := fmt.Sprintf(`global: {scrape_interval: 1s}
scrape_configs:
  - job_name: gantry-nodeagent
    authorization: {credentials_file: %[1]s}
    scrape_timeout: 1s
    http_sd_configs:
      - url: %[2]s/api/v1/internal/metrics/nodes
        refresh_interval: 1s
        authorization: {type: Bearer, credentials_file: %[1]s}
`, tokenFile, w.Server.URL)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd := exec.Command(promBin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+promAddr)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			log, _ := os.ReadFile(out.Name())
			t.Logf("prometheus output:\n%s", log)
		}
	})
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		if resp, err := http.Get("http://" + promAddr + "/api/v1/targets"); err == nil {
			var b bytes.Buffer
			_, _ = b.ReadFrom(resp.Body)
			resp.Body.Close()
			t.Logf("targets: %s", b.String())
		}
	})

	query := fmt.Sprintf(`gantry_nodeagent_build_info{job="gantry-nodeagent",node_id="%s",version="1.7.0"}`, nodeID)
	client := &http.Client{Timeout: 5 * time.Second}
	eventually(t, "Prometheus to hold the node's build info", func() bool {
		resp, err := client.Get("http://" + promAddr + "/api/v1/query?query=" + url.QueryEscape(query))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var r struct {
			Data struct {
				Result []struct {
					Value []any `json:"value"`
				} `json:"result"`
			} `json:"data"`
		}
		if json.NewDecoder(resp.Body).Decode(&r) != nil || len(r.Data.Result) != 1 || len(r.Data.Result[0].Value) != 2 {
			return false
		}
		return r.Data.Result[0].Value[1] == "1"
	})
}
