package proxy_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/proxy"
	"github.com/gantry-gpu/gantry/controlplane/internal/auth"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/nodeagent/agent"
	nodeapps "github.com/gantry-gpu/gantry/nodeagent/apps"
	"github.com/gantry-gpu/gantry/nodeagent/gpu"
	noderuntime "github.com/gantry-gpu/gantry/nodeagent/runtime"
	"github.com/gantry-gpu/gantry/nodeagent/tasks"
	"github.com/gantry-gpu/gantry/proto/api"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"github.com/gantry-gpu/gantry/shared/obs"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

// waitLimit bounds every wait so a broken proxy fails a test instead of hanging it;
// nothing asserts how long anything took.
const waitLimit = 60 * time.Second

type okDialer struct{}

func (okDialer) DialContext(context.Context, string, string) (net.Conn, error) {
	c1, c2 := net.Pipe()
	_ = c2.Close()
	return c1, nil
}

// world is a control plane (replica "ra", its fabric and terminal relay running) with
// a tenant acme whose admin is alice, and the app proxy mounted in front of its API.
type world struct {
	*apitest.Env
	root  string
	Acme  apitest.Tenant
	Proxy *proxy.Service
	URL   string // the proxy (and API) base URL
	JS    jetstream.JetStream
}

func newWorld(t testing.TB) *world {
	t.Helper()
	e := apitest.New(t,
		apitest.WithOptions(func(o *app.Options) { o.NodeProbeDialer = okDialer{} }),
		apitest.WithConfig(func(c *app.Config) { c.Fabric.ReplicaID = "ra" }))
	_, root := e.PlatformAdmin(t)
	w := &world{Env: e, root: root}
	w.Acme = e.NewTenant(t, root, "Acme")
	js, err := jetstream.New(e.App.NATS)
	if err != nil {
		t.Fatal(err)
	}
	w.JS = js
	runFabric(t, e.App)
	w.Proxy, w.URL = w.proxyFor(t, e.App, e.Server.URL)
	return w
}

// proxyFor assembles the proxy of replica a (as app.New will) and serves it with a's
// API on a new HTTP server; the terminal relay of a runs with that server's URL.
// The tests change instances' rows between requests and expect the next request to see
// it, so the admission cache is off (TestProxyAdmissionCache covers it).
func (w *world) proxyFor(t testing.TB, a *app.App, _ string) (*proxy.Service, string) {
	t.Helper()
	p := w.newProxy(t, a, proxy.Config{AccessCacheTTL: -1}, a.Clock)
	srv := httptest.NewServer(p.Mount(a.Handler))
	t.Cleanup(func() { p.Close(); srv.CloseClientConnections(); srv.Close() })
	runTerminal(t, w, a, srv.URL)
	return p, srv.URL
}

func (w *world) newProxy(t testing.TB, a *app.App, cfg proxy.Config, clk clock.Clock) *proxy.Service {
	t.Helper()
	return w.newProxyWith(t, a, cfg, clk, nil)
}

// newProxyWith is newProxy with deps adjusted by edit (a Meter, a Limiter).
func (w *world) newProxyWith(t testing.TB, a *app.App, cfg proxy.Config, clk clock.Clock, edit func(*proxy.Deps)) *proxy.Service {
	t.Helper()
	testenv.CleanupKV(t, w.JS, a.Config.EventsStream+"_APP_PROXY_CODES")
	cfg.CodeBucket = a.Config.EventsStream + "_APP_PROXY_CODES"
	deps := proxy.Deps{
		Instances: proxy.DBInstances{Pool: w.Pool}, Auth: auth.NewAuthenticator(a.Keys, a.Config.Auth, a.Clock),
		Projects: a.Tenancy, Streams: a.Terminal, JS: w.JS, CookieKey: a.Config.Auth.MasterKey.Derive("gantry/app-proxy-cookie"),
		Denials: a.Denials, Registry: prometheus.NewRegistry(), Clock: clk,
	}
	if edit != nil {
		edit(&deps)
	}
	p, err := proxy.New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func runFabric(t testing.TB, a *app.App) {
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

func runTerminal(t testing.TB, w *world, a *app.App, url string) {
	testenv.CleanupKV(t, w.JS, a.Config.EventsStream+"_TERMINAL_REPLICAS")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Terminal.Run(ctx, url) }()
	t.Cleanup(func() { cancel(); <-done })
}

// secondReplica is another control plane of the same deployment (database, NATS,
// events stream, presence bucket) with its own fabric, relay and proxy.
func (w *world) secondReplica(t testing.TB, id string) (*app.App, *proxy.Service, string) {
	t.Helper()
	cfg := w.App.Config
	cfg.Fabric.ReplicaID = id
	cfg.Fabric.Addr = "127.0.0.1:0"
	log := obs.NewLogger(io.Discard, "gantry-controlplane", slog.LevelError)
	a, err := app.New(context.Background(), cfg, log, app.Options{Pool: w.Pool, NodeProbeDialer: okDialer{}})
	if err != nil {
		t.Fatalf("second replica: %v", err)
	}
	t.Cleanup(a.Close)
	runFabric(t, a)
	p, url := w.proxyFor(t, a, "")
	return a, p, url
}

// appStreams is the agent's APP_PROXY stream server: the node's real app supervisor
// (nodeagent/apps), which serves the instances it runs. One case needs an instance
// the supervisor cannot have, a running app whose port refuses connections (a
// supervised app that stops listening is restarted or marked unhealthy); its port is
// registered here and its streams are served the supervisor's way (connect to
// 127.0.0.1:<port>, pipe both ways), so the agent answers connect_failed.
type appStreams struct {
	sup   *nodeapps.Supervisor
	ports sync.Map // app_instance_id -> port of an in-process test app
}

func (s *appStreams) ServeStream(ctx context.Context, pre *fabricv1.StreamPreamble, st net.Conn) {
	v, ok := s.ports.Load(pre.GetAppInstanceId())
	if !ok || pre.GetKind() != fabricv1.StreamKind_STREAM_KIND_APP_PROXY {
		s.sup.ServeStream(ctx, pre, st)
		return
	}
	defer st.Close()
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", v.(int)))
	if err != nil {
		_ = fabricnet.WriteReply(st, &fabricv1.StreamReply{ErrorCode: "connect_failed"})
		return
	}
	defer c.Close()
	if fabricnet.WriteReply(st, &fabricv1.StreamReply{Ok: true}) != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(c, st); closeWrite(c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(st, c); closeWrite(st); done <- struct{}{} }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	_ = st.Close()
	_ = c.Close()
	<-done
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// staticGPU is one healthy H100 without NVML.
type staticGPU struct{ uuid string }

func (g staticGPU) Name() string { return "static" }
func (g staticGPU) Inventory(context.Context) (gpu.Inventory, error) {
	return gpu.Inventory{DriverVersion: "550.54.15", CUDAVersion: "12.4", GPUs: []gpu.GPU{{
		Index: 0, UUID: g.uuid, Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 81920 << 20, PCIBusID: "0000:18:00.0",
		DriverVersion: "550.54.15", CUDAVersion: "12.4",
	}}}, nil
}
func (g staticGPU) Sample(context.Context) ([]gpu.Metrics, error) {
	return []gpu.Metrics{{UUID: g.uuid, Healthy: true, SampledAt: time.Now()}}, nil
}
func (g staticGPU) Close() error { return nil }

type gpuNode struct {
	id   uuid.UUID
	apps *appStreams
	sup  *nodeapps.Supervisor
	envs *liveEnvs
}

// liveEnvs are the node's live allocations as the runtime would report them (process
// runtime: the agent's own user, a home directory each).
type liveEnvs struct {
	t  testing.TB
	mu sync.Mutex
	m  map[string]noderuntime.SessionEnv
}

func (e *liveEnvs) Session(id string) (noderuntime.SessionEnv, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	env, ok := e.m[id]
	return env, ok
}

func (e *liveEnvs) add(id uuid.UUID) string {
	home := e.t.TempDir()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.m[id.String()] = noderuntime.SessionEnv{AllocationID: id.String(), User: "gantry-test", Dir: home, Shell: "/bin/sh",
		Env: []string{"HOME=" + home, "USER=gantry-test", "CUDA_VISIBLE_DEVICES=GPU-test"}}
	return home
}

var nodeSeq atomic.Int32

// agentNode enrolls a node and runs a real node agent (nodeagent/agent) against a's
// fabric, serving APP_PROXY streams, until the test ends.
func (w *world) agentNode(t testing.TB) *gpuNode {
	t.Helper()
	ctx := context.Background()
	a := w.App
	n, err := a.Nodes.Create(ctx, nodes.Spec{Name: fmt.Sprintf("gpu-%d", nodeSeq.Add(1)), Address: fmt.Sprintf("10.9.0.%d", nodeSeq.Load())})
	if err != nil {
		t.Fatal(err)
	}
	et, err := a.Nodes.IssueEnrollmentToken(ctx, n.ID)
	if err != nil {
		t.Fatal(err)
	}
	en, err := a.Nodes.Enroll(ctx, et.Token, "gpu-host", "test/1")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(a.Fabric.CAPEM())
	envs := &liveEnvs{t: t, m: map[string]noderuntime.SessionEnv{}}
	sup, err := nodeapps.New(nodeapps.Options{Envs: envs, ReportInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	mux := tasks.NewMux()
	sup.Register(mux)
	supCtx, stopSup := context.WithCancel(ctx)
	if err := sup.Restore(supCtx); err != nil {
		t.Fatal(err)
	}
	apps := &appStreams{sup: sup}
	ag, err := agent.New(agent.Options{
		Executor: mux, Reports: sup,
		Addr: a.Fabric.ListenAddr().String(), Transport: fabricnet.ModeTCP, TLS: &tls.Config{RootCAs: pool},
		Token: func() (string, error) { return en.NodeToken, nil }, AgentVersion: "test/1", Hostname: "gpu-host",
		GPU: staticGPU{uuid: "GPU-" + n.ID.String()}, Streams: apps,
		Backoff: agent.Backoff{Min: 50 * time.Millisecond, Max: 500 * time.Millisecond},
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = ag.Run(actx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		for _, r := range sup.Reports() {
			_ = sup.Stop(context.Background(), r.GetObjectId(), r.GetAppInstance().GetAllocationId(), 2*time.Second)
		}
		stopSup()
		sup.Wait()
	})
	eventually(t, "the node online", func() bool {
		got, err := a.Nodes.Get(ctx, n.ID)
		return err == nil && got.Status == nodes.StatusOnline && ag.Status().Connected
	})
	return &gpuNode{id: n.ID, apps: apps, sup: sup, envs: envs}
}

// instance records an app instance of acme's default project on node, served by the
// in-process app listening at addr, in state.
func (w *world) instance(t testing.TB, node *gpuNode, addr, state string, runSpec string) uuid.UUID {
	t.Helper()
	id := uuid.New()
	return w.record(t, id, uuid.New(), node, addr, state, runSpec, true)
}

// record inserts the app_instances row (as the instances service would have it);
// inProcess registers addr as an in-process test app on node.
func (w *world) record(t testing.TB, id, allocationID uuid.UUID, node *gpuNode, addr, state, runSpec string, inProcess bool) uuid.UUID {
	t.Helper()
	_, port, _ := net.SplitHostPort(addr)
	var p int
	fmt.Sscan(port, &p)
	if runSpec == "" {
		runSpec = `{"command":"test-app"}`
	}
	nodeID := uuid.New()
	if node != nil {
		nodeID = node.id
		if inProcess {
			node.apps.ports.Store(id.String(), p)
		}
	}
	if _, err := w.Pool.Exec(context.Background(), `
INSERT INTO app_instances (id, tenant_id, project_id, owner_user_id, name, app_slug, app_version, app_name, allocation_id, node_id, port, state, run_spec, created_at, updated_at)
VALUES ($1, $2, $3, $4, 'nb', 'test-app', '1.0', 'Test app', $5, $6, $7, $8, $9::jsonb, now(), now())`,
		id, w.Acme.ID, w.Acme.DefaultProject, w.Acme.AdminID, allocationID, nodeID, p, state, runSpec); err != nil {
		t.Fatal(err)
	}
	return id
}

func (w *world) setState(t testing.TB, id uuid.UUID, state string) {
	t.Helper()
	if _, err := w.Pool.Exec(context.Background(), `UPDATE app_instances SET state = $2 WHERE id = $1`, id, state); err != nil {
		t.Fatal(err)
	}
}

// principalOf authenticates a bearer token as the API would.
func (w *world) principalOf(t testing.TB, token string) *principal.Principal {
	t.Helper()
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer "+token)
	p, err := auth.NewAuthenticator(w.App.Keys, w.App.Config.Auth, w.App.Clock).Authenticate(r)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// mint is createAppProxySession for token's user in acme's default project.
func (w *world) mint(t testing.TB, token string, id uuid.UUID) (proxy.Session, error) {
	t.Helper()
	p := w.principalOf(t, token)
	proj, err := w.App.Tenancy.Access(context.Background(), p, w.Acme.DefaultProject)
	if err != nil {
		return proxy.Session{}, err
	}
	return w.Proxy.Mint(context.Background(), p, proj, id)
}

var _ = projectctx.RoleMember

// member adds a new acme user to the default project with role; returns its token.
func (w *world) member(t testing.TB, role api.ProjectRole) string {
	t.Helper()
	id, tok := w.NewUser(t, w.Acme.AdminToken, "member")
	r, err := w.Client(w.Acme.AdminToken).AddProjectMemberWithResponse(context.Background(), w.Acme.DefaultProject, &api.AddProjectMemberParams{},
		api.AddProjectMemberRequest{UserID: id, Role: role})
	if err != nil || r.StatusCode() != 201 {
		t.Fatalf("add member: %v %s", err, r.Body)
	}
	return tok
}

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

// envelope is an error answer.
type envelope struct {
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details"`
}

// do sends a request through the proxy with an optional bearer token and cookies.
func do(t testing.TB, c *http.Client, method, url, token string, body io.Reader) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// wantEnvelope reads resp as an envelope with status and code.
func wantEnvelope(t testing.TB, resp *http.Response, status int, code string) envelope {
	t.Helper()
	defer resp.Body.Close()
	var env envelope
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &env)
	if resp.StatusCode != status || env.Code != code {
		t.Fatalf("%s %s: got %d %s, want %d %s", resp.Request.Method, resp.Request.URL.Path, resp.StatusCode, b, status, code)
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") || resp.Header.Get("X-Request-Id") == "" {
		t.Fatalf("envelope without JSON content type or X-Request-Id: %v", resp.Header)
	}
	return env
}
