package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/nodeagent/agent"
	"github.com/gantry-gpu/gantry/nodeagent/config"
	"github.com/gantry-gpu/gantry/nodeagent/enroll"
	"github.com/gantry-gpu/gantry/nodeagent/gpu"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/obs"
)

// cp is a running control plane: the HTTP API (apitest) and the fabric server.
type cp struct {
	t     testing.TB
	env   *apitest.Env
	app   *app.App // the app whose fabric is serving now (changes on restart)
	url   string   // its HTTP API
	admin string   // platform admin bearer

	stopFabric context.CancelFunc
	fabricDone chan struct{}
}

func startCP(t testing.TB, opts ...apitest.Option) *cp {
	t.Helper()
	opts = append([]apitest.Option{apitest.WithOptions(func(o *app.Options) { o.NodeProbeDialer = refusingProbeDialer{} })}, opts...)
	env := apitest.New(t, opts...)
	c := &cp{t: t, env: env, app: env.App, url: env.Server.URL}
	_, c.admin = env.PlatformAdmin(t)
	c.runFabric(env.App)
	return c
}

func (c *cp) runFabric(a *app.App) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := a.Fabric.Run(ctx); err != nil {
			c.t.Errorf("fabric: %v", err)
		}
	}()
	c.app, c.stopFabric, c.fabricDone = a, cancel, done
	c.t.Cleanup(func() { cancel(); <-done })
}

// restart stops the fabric (every tunnel ends, the port is released) and assembles a
// second control plane on the same database, NATS and fabric port, as a restarted
// replica would be, serving its own HTTP API.
func (c *cp) restart() {
	c.t.Helper()
	addr := c.app.Fabric.ListenAddr().String()
	c.stopFabric()
	<-c.fabricDone
	cfg := c.env.App.Config
	cfg.Fabric.Addr = addr
	cfg.Fabric.ReplicaID = c.app.Fabric.ReplicaID()
	log := obs.NewLogger(io.Discard, "gantry-controlplane", slog.LevelError)
	var a *app.App
	var err error
	// The old listener's UDP socket may take a moment to be released by the kernel.
	for i := 0; ; i++ {
		a, err = app.New(context.Background(), cfg, log, app.Options{Pool: c.env.Pool, NodeProbeDialer: refusingProbeDialer{}})
		if err == nil || i == 50 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		c.t.Fatalf("restart control plane: %v", err)
	}
	c.t.Cleanup(a.Close)
	srv := httptest.NewServer(a.Handler)
	c.t.Cleanup(srv.Close)
	c.url = srv.URL
	c.runFabric(a)
}

func (c *cp) client() *api.ClientWithResponses { return c.env.Client(c.admin) }

// newNode creates a node through the admin API and mints its enrollment token.
func (c *cp) newNode(name string) (uuid.UUID, string) {
	c.t.Helper()
	ctx := context.Background()
	res, err := c.client().CreateNodeWithResponse(ctx, &api.CreateNodeParams{}, api.CreateNodeJSONRequestBody{Name: name, Address: "10.20.0." + fmt.Sprint(len(name))})
	if err != nil || res.JSON201 == nil {
		c.t.Fatalf("create node: %v %d %s", err, res.StatusCode(), res.Body)
	}
	id := uuid.UUID(res.JSON201.ID)
	tok, err := c.client().CreateNodeEnrollmentTokenWithResponse(ctx, id, &api.CreateNodeEnrollmentTokenParams{})
	if err != nil || tok.JSON201 == nil {
		c.t.Fatalf("enrollment token: %v %d %s", err, tok.StatusCode(), tok.Body)
	}
	return id, tok.JSON201.EnrollmentToken
}

// fleet reads GET /api/v1/admin/telemetry/fleet from the serving control plane.
func (c *cp) fleet() api.FleetTelemetryResponse {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, c.url+"/api/v1/admin/telemetry/fleet", nil)
	req.Header.Set("Authorization", "Bearer "+c.admin)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer res.Body.Close()
	var out api.FleetTelemetryResponse
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		c.t.Fatalf("fleet telemetry: %d %s", res.StatusCode, b)
	}
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		c.t.Fatal(err)
	}
	return out
}

func (c *cp) fleetNode(id uuid.UUID) (api.FleetNode, bool) {
	for _, n := range c.fleet().Nodes {
		if uuid.UUID(n.NodeID) == id {
			return n, true
		}
	}
	return api.FleetNode{}, false
}

// enrolled is an agent's enrolled configuration on disk.
type enrolled struct {
	cfg    config.Config
	nodeID uuid.UUID
}

// enrollAgent runs what `gantry-nodeagent enroll` runs, into a fresh config directory.
func (c *cp) enrollAgent(token, hostname string) enrolled {
	c.t.Helper()
	cfg := config.Default()
	cfg.Path = filepath.Join(c.t.TempDir(), "nodeagent.conf")
	cfg.Hostname = hostname
	cfg.GPUBackend = gpu.BackendMockH100
	res, err := enroll.Call(context.Background(), c.env.HTTPClient(), c.url, enroll.Request{EnrollmentToken: token, Hostname: hostname, AgentVersion: "e2e-1.0"})
	if err != nil {
		c.t.Fatalf("enroll: %v", err)
	}
	cfg, err = enroll.Apply(cfg, c.url, res)
	if err != nil {
		c.t.Fatal(err)
	}
	return enrolled{cfg: cfg, nodeID: uuid.MustParse(res.NodeID)}
}

// runningAgent is an in-process agent built exactly as `gantry-nodeagent run` builds it.
type runningAgent struct {
	*agent.Agent
	mock *gpu.Mock

	mu      sync.Mutex
	retries []time.Duration

	cancel context.CancelFunc
	done   chan error
}

func (c *cp) runAgent(e enrolled, tune func(*agent.Options)) *runningAgent {
	c.t.Helper()
	opts, err := agent.OptionsFromConfig(e.cfg, "e2e-1.0")
	if err != nil {
		c.t.Fatal(err)
	}
	m, err := gpu.NewMock(e.cfg.GPUBackend, gpu.Options{MockSeed: e.cfg.NodeID})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = m.Close() })
	r := &runningAgent{mock: m, done: make(chan error, 1)}
	opts.GPU = m
	opts.Logger = slog.New(slog.NewTextHandler(testLog{c.t}, &slog.HandlerOptions{Level: slog.LevelInfo})).With("agent", e.cfg.Hostname)
	opts.Backoff = agent.Backoff{Min: 100 * time.Millisecond, Max: 2 * time.Second}
	opts.DialOptions = nil
	opts.OnRetry = func(_ int, d time.Duration, _ error) {
		r.mu.Lock()
		r.retries = append(r.retries, d)
		r.mu.Unlock()
	}
	if tune != nil {
		tune(&opts)
	}
	a, err := agent.New(opts)
	if err != nil {
		c.t.Fatal(err)
	}
	r.Agent = a
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- a.Run(ctx) }()
	c.t.Cleanup(func() { _ = r.stop(c.t) })
	return r
}

func (r *runningAgent) stop(t testing.TB) error {
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
		}
		return err
	case <-time.After(30 * time.Second):
		t.Error("agent did not stop within 30s of cancellation")
		return nil
	}
}

func (r *runningAgent) retryDelays() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.retries...)
}

// eventually polls cond every 50 ms for up to 60 s (generous: the machine is shared);
// it never asserts how long anything took.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type testLog struct{ t testing.TB }

func (w testLog) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// tcpCutter is a TCP relay between an agent and the fabric whose connections a test can
// cut, as a broken link or a NAT timeout would.
type tcpCutter struct {
	ln    net.Listener
	to    string
	mu    sync.Mutex
	conns []net.Conn
}

func newTCPCutter(t *testing.T, to string) *tcpCutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &tcpCutter{ln: ln, to: to}
	t.Cleanup(func() { _ = ln.Close(); c.cut() })
	go c.serve()
	return c
}

func (c *tcpCutter) addr() string { return c.ln.Addr().String() }

func (c *tcpCutter) serve() {
	for {
		in, err := c.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", c.to)
		if err != nil {
			_ = in.Close()
			continue
		}
		c.mu.Lock()
		c.conns = append(c.conns, in, out)
		c.mu.Unlock()
		go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
		go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
	}
}

// cut drops every relayed connection (both sides see a reset/EOF).
func (c *tcpCutter) cut() {
	c.mu.Lock()
	conns := c.conns
	c.conns = nil
	c.mu.Unlock()
	for _, cn := range conns {
		if tc, ok := cn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = cn.Close()
	}
}
