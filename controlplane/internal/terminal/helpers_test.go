package terminal_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
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
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/contract"
	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/controlplane/internal/terminal"
	"github.com/gantry-gpu/gantry/nodeagent/agent"
	"github.com/gantry-gpu/gantry/nodeagent/gpu"
	"github.com/gantry-gpu/gantry/nodeagent/sshserver"
	nodeterm "github.com/gantry-gpu/gantry/nodeagent/terminal"
	"github.com/gantry-gpu/gantry/proto/api"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"github.com/gantry-gpu/gantry/shared/obs"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

const (
	h100   = "NVIDIA H100 80GB HBM3"
	region = "eu-west-1"
	sku1x  = "h100-80gb-sxm.1x"
	unit   = "gpu.h100"
	// waitLimit bounds every wait so a broken bridge fails a test instead of hanging it;
	// nothing asserts how long anything took.
	waitLimit = 30 * time.Second
)

// okDialer stands in for the node probe's network: test nodes live on addresses this
// machine does not have.
type okDialer struct{}

func (okDialer) DialContext(context.Context, string, string) (net.Conn, error) {
	c1, c2 := net.Pipe()
	_ = c2.Close()
	return c1, nil
}

// world is a control plane (replica "ra") with a region, a 1-GPU H100 SKU, and a tenant
// (acme) whose admin alice has an SSH key and credit.
type world struct {
	*apitest.Env
	Root  *api.ClientWithResponses
	root  string
	Acme  apitest.Tenant
	Alice *api.ClientWithResponses
}

func newWorld(t testing.TB, opts ...apitest.Option) *world {
	t.Helper()
	opts = append([]apitest.Option{
		apitest.WithOptions(func(o *app.Options) { o.NodeProbeDialer = okDialer{} }),
		apitest.WithConfig(func(c *app.Config) { c.Fabric.ReplicaID = "ra" }),
	}, opts...)
	e := apitest.New(t, opts...)
	ctx := context.Background()
	_, rootTok := e.PlatformAdmin(t)
	w := &world{Env: e, Root: e.Client(rootTok), root: rootTok}
	state, isDefault := api.V3RegionAvailabilityState("available"), true
	if r, err := w.Root.CreateRegionWithResponse(ctx, &api.CreateRegionParams{}, api.CreateRegionJSONRequestBody{
		Code: region, Label: "EU West", AvailabilityState: &state, IsDefault: &isDefault,
	}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("region: %v %s", err, r.Body)
	}
	if r, err := w.Root.CreateSkuWithResponse(ctx, &api.CreateSkuParams{}, api.CreateSkuJSONRequestBody{
		ID: sku1x, GpuModel: h100, GpuCount: 1, Vcpu: 26, MemoryGib: 225, DiskGib: 2000, UsageUnit: unit, Regions: []string{region},
	}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("sku: %v %s", err, r.Body)
	}
	if r, err := w.Root.CreateBillingPricingPlanWithResponse(ctx, &api.CreateBillingPricingPlanParams{}, api.BillingPricingPlanCreateRequest{
		Name: "standard", IsDefault: ptr(true), Prices: []api.BillingPrice{{UsageUnit: unit, Currency: "USD", UnitPrice: "0.001"}},
	}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("plan: %v %s", err, r.Body)
	}
	w.Acme = e.NewTenant(t, rootTok, "Acme")
	w.Alice = e.Client(w.Acme.AdminToken)
	w.addKey(t, w.Alice)
	if r, err := w.Root.CreateBillingAdjustmentWithResponse(ctx, &api.CreateBillingAdjustmentParams{},
		api.BillingAdjustmentRequest{TenantID: w.Acme.ID, Amount: api.Money{AmountMinor: 1_000_000, Currency: "USD"}, Reason: "test credit"}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("credit: %v %s", err, r.Body)
	}
	return w
}

func ptr[T any](v T) *T { return &v }

func (w *world) addKey(t testing.TB, c *api.ClientWithResponses) {
	t.Helper()
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	sp, _ := ssh.NewPublicKey(pub)
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp)))
	r, err := c.CreateSSHKeyWithResponse(context.Background(), &api.CreateSSHKeyParams{}, api.CreateSSHKeyJSONRequestBody{Name: "laptop", PublicKey: line})
	if err != nil || r.StatusCode() != 201 {
		t.Fatalf("ssh key: %v %s", err, r.Body)
	}
}

// member adds a new tenant user to acme's default project with role and returns a client.
func (w *world) member(t testing.TB, role api.ProjectRole) (uuid.UUID, *api.ClientWithResponses) {
	t.Helper()
	id, tok := w.NewUser(t, w.Acme.AdminToken, "member")
	r, err := w.Alice.AddProjectMemberWithResponse(context.Background(), w.Acme.DefaultProject, &api.AddProjectMemberParams{},
		api.AddProjectMemberRequest{UserID: id, Role: role})
	if err != nil || r.StatusCode() != 201 {
		t.Fatalf("add member: %v %s", err, r.Body)
	}
	return id, w.Client(tok)
}

// runFabric serves a's node fabric until the test ends.
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

// runTerminal runs a's terminal service (relay address, allocation events) with the
// base URL other replicas reach it at.
func runTerminal(t testing.TB, a *app.App, url string) {
	js, err := jetstream.New(a.NATS)
	if err != nil {
		t.Fatal(err)
	}
	testenv.CleanupKV(t, js, a.Config.EventsStream+"_TERMINAL_REPLICAS")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Terminal.Run(ctx, url) }()
	t.Cleanup(func() { cancel(); <-done })
}

// staticGPU is a GPU backend with one healthy H100 (no NVML involved).
type staticGPU struct{ uuid string }

func (g staticGPU) Name() string { return "static" }
func (g staticGPU) Inventory(context.Context) (gpu.Inventory, error) {
	return gpu.Inventory{DriverVersion: "550.54.15", CUDAVersion: "12.4", GPUs: []gpu.GPU{{
		Index: 0, UUID: g.uuid, Model: h100, MemoryBytes: 81920 << 20, PCIBusID: "0000:18:00.0",
		DriverVersion: "550.54.15", CUDAVersion: "12.4",
	}}}, nil
}
func (g staticGPU) Sample(context.Context) ([]gpu.Metrics, error) {
	return []gpu.Metrics{{UUID: g.uuid, Healthy: true, SampledAt: time.Now()}}, nil
}
func (g staticGPU) Close() error { return nil }

// liveEnvs is the allocation runtime as the agent's terminal server sees it.
type liveEnvs struct {
	t  testing.TB
	mu sync.Mutex
	m  map[string]nodeterm.SessionEnv
}

func (e *liveEnvs) Session(id string) (nodeterm.SessionEnv, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	env, ok := e.m[id]
	return env, ok
}

func (e *liveEnvs) add(id uuid.UUID) {
	home := e.t.TempDir()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.m[id.String()] = nodeterm.SessionEnv{
		User: "gantry-test", Dir: home, Shell: "/bin/sh",
		Env: []string{"HOME=" + home, "PS1=$ ", "ENV=", "CUDA_VISIBLE_DEVICES=GPU-test"},
	}
}

// gpuNode is a node with a real node agent (nodeagent/agent) whose raw streams the
// real terminal server (nodeagent/terminal) serves, with real PTYs.
type gpuNode struct {
	id    uuid.UUID
	term  *nodeterm.Server
	envs  *liveEnvs
	agent *agent.Agent
	stop  context.CancelFunc
	done  chan struct{}
	// sshKeys is the authorized_keys file the node's SSH server trusts.
	sshKeys string
}

var nodeSeq atomic.Int32

// agentNode creates and enrolls a node in the region and runs its agent against the
// fabric of a (TCP+yamux, or QUIC), until the test ends.
func (w *world) agentNode(t testing.TB, a *app.App, mode fabricnet.Mode, termOpts nodeterm.Options) *gpuNode {
	t.Helper()
	ctx := context.Background()
	reg := region
	n, err := w.App.Nodes.Create(ctx, nodes.Spec{Name: fmt.Sprintf("gpu-%d", nodeSeq.Add(1)), Address: fmt.Sprintf("10.9.0.%d", nodeSeq.Load()), Region: &reg})
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
	envs := &liveEnvs{t: t, m: map[string]nodeterm.SessionEnv{}}
	term := nodeterm.New(envs, termOpts)
	// SSH streams (nodeagent/sshserver, in-process server) into the same live
	// allocations, trusting the keys of sshKeys.
	sshKeys := filepath.Join(t.TempDir(), "authorized_keys")
	sshSrv, err := sshserver.New(sshserver.EnvironmentsFunc(func(id string) (sshserver.Env, bool) {
		e, ok := envs.Session(id)
		return sshserver.Env{AllocationID: id, User: e.User, Dir: e.Dir, Shell: e.Shell, Env: e.Env, AuthorizedKeys: sshKeys}, ok
	}), sshserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(a.Fabric.CAPEM())
	ag, err := agent.New(agent.Options{
		Addr: a.Fabric.ListenAddr().String(), Transport: mode, TLS: &tls.Config{RootCAs: pool},
		DialOptions: &fabricnet.DialOptions{QUICFallbackAfter: 500 * time.Millisecond},
		Token:       func() (string, error) { return en.NodeToken, nil }, AgentVersion: "test/1", Hostname: "gpu-host",
		GPU: staticGPU{uuid: "GPU-" + n.ID.String()}, Streams: sshserver.Streams{SSH: sshSrv, Other: term},
		Backoff: agent.Backoff{Min: 50 * time.Millisecond, Max: 500 * time.Millisecond},
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	g := &gpuNode{id: n.ID, term: term, envs: envs, agent: ag, stop: cancel, done: make(chan struct{}), sshKeys: sshKeys}
	go func() { defer close(g.done); _ = ag.Run(actx) }()
	t.Cleanup(func() { cancel(); <-g.done; term.Close(); sshSrv.Close() })
	eventually(t, "the node online", func() bool {
		got, err := w.App.Nodes.Get(ctx, n.ID)
		return err == nil && got.Status == nodes.StatusOnline && ag.Status().Connected
	})
	return g
}

func (w *world) rootToken(testing.TB) string { return w.root }

// fakeNode is an online node with two GPUs and without an agent (tests that fail before any stream).
func (w *world) fakeNode(t testing.TB) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	reg := region
	name := fmt.Sprintf("fake-%d", nodeSeq.Add(1))
	n, err := w.App.Nodes.Create(ctx, nodes.Spec{Name: name, Address: fmt.Sprintf("10.8.0.%d", nodeSeq.Load()), Region: &reg})
	if err != nil {
		t.Fatal(err)
	}
	inv := fleet.Inventory{AgentVersion: "1.0.0", Hostname: name}
	for i := 0; i < 2; i++ {
		inv.GPUs = append(inv.GPUs, fleet.GPU{
			Index: i, UUID: fmt.Sprintf("GPU-%s-%d", n.ID, i), Model: h100, MemoryBytes: 81920 << 20,
			PCIBusID: fmt.Sprintf("0000:%02x:00.0", 0x18+i), DriverVersion: "550.54.15", CUDAVersion: "12.4",
		})
	}
	if err := w.App.Nodes.NodeConnected(ctx, n.ID, inv, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := w.App.Nodes.NodeStatus(ctx, n.ID, true, time.Now()); err != nil {
		t.Fatal(err)
	}
	return n.ID
}

// activeAllocation launches a 1-GPU allocation for alice and reports it provisioned, so
// it is active; when node has an agent, the allocation becomes live there too.
func (w *world) activeAllocation(t testing.TB, node uuid.UUID, g *gpuNode) api.Allocation {
	t.Helper()
	ctx := context.Background()
	r, err := w.Alice.CreateAllocationWithResponse(ctx, &api.CreateAllocationParams{XProjectID: w.Acme.DefaultProject},
		api.CreateAllocationJSONRequestBody{Name: "train", Sku: sku1x})
	if err != nil || r.StatusCode() != 201 {
		t.Fatalf("create allocation: %v %s", err, r.Body)
	}
	a := *r.JSON201
	if a.NodeID != node {
		t.Fatalf("allocation placed on %s, want %s", a.NodeID, node)
	}
	var task uuid.UUID
	if err := w.Pool.QueryRow(ctx, `SELECT task_id FROM allocation_tasks WHERE allocation_id = $1 AND kind = 'allocation.provision'`, a.ID).Scan(&task); err != nil {
		t.Fatal(err)
	}
	if err := w.App.Allocations.TaskResult(ctx, node, &fabricv1.TaskResult{
		TaskId: task.String(), Status: fabricv1.TaskResultStatus_TASK_RESULT_STATUS_SUCCEEDED,
		Result: []byte(`{"host":"10.9.0.1","port":22,"user":"gantry-a1"}`),
	}); err != nil {
		t.Fatal(err)
	}
	if g != nil {
		g.envs.add(a.ID)
	}
	return a
}

// mint asks for a terminal token as c.
func (w *world) mint(t testing.TB, c *api.ClientWithResponses, alloc uuid.UUID, body api.TerminalSessionCreateRequest) *api.CreateTerminalSessionHTTPResponse {
	t.Helper()
	r, err := c.CreateTerminalSessionWithResponse(context.Background(), alloc, &api.CreateTerminalSessionParams{XProjectID: w.Acme.DefaultProject}, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (w *world) mustMint(t testing.TB, alloc uuid.UUID, body api.TerminalSessionCreateRequest) api.TerminalSession {
	t.Helper()
	r := w.mint(t, w.Alice, alloc, body)
	if r.StatusCode() != 201 {
		t.Fatalf("mint: %d %s", r.StatusCode(), r.Body)
	}
	return *r.JSON201
}

func (w *world) count(t testing.TB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := w.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// counters reads the two token counters of a's registry.
func counters(t testing.TB, a *app.App) (ok, replay float64) {
	t.Helper()
	mfs, err := a.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "terminal_token_consumed_ok_total":
			ok = mf.GetMetric()[0].GetCounter().GetValue()
		case "terminal_token_replay_rejected_total":
			replay = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return ok, replay
}

// checkingTransport validates every handshake answer that is not the upgrade itself
// against the contract (a 101's body is the connection and cannot be read).
type checkingTransport struct {
	t testing.TB
	c *contract.Contract
}

func (ct checkingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || resp.StatusCode == http.StatusSwitchingProtocols {
		return resp, err
	}
	if resp.Header.Get("X-Request-Id") == "" {
		ct.t.Errorf("%s -> %d without X-Request-Id", req.URL.Path, resp.StatusCode)
	}
	route, id := terminal.RouteTerminal, strings.TrimPrefix(req.URL.Path, "/ws/terminal/")
	if strings.HasPrefix(req.URL.Path, "/api/v1/internal/terminal/relay/") {
		route, id = terminal.RouteRelay, strings.TrimPrefix(req.URL.Path, "/api/v1/internal/terminal/relay/")
	}
	if op := ct.c.Op(http.MethodGet, route); op != nil {
		if err := op.ValidateResponse(req.Context(), req, map[string]string{"allocation_id": id}, resp); err != nil {
			ct.t.Errorf("contract violation: %v", err)
		}
	} else {
		ct.t.Errorf("no contract operation for %s", route)
	}
	return resp, nil
}

// term is a browser's end of a terminal WebSocket: it reads every frame in the
// background, collecting output bytes and control messages.
type term struct {
	t    testing.TB
	ws   *websocket.Conn
	resp *http.Response

	mu      sync.Mutex
	out     bytes.Buffer
	ctls    []map[string]any
	readErr error
	changed chan struct{}
}

func wsURL(base string) string { return "ws" + strings.TrimPrefix(base, "http") }

// dial opens /ws/terminal/{alloc} on base with the token offered as a subprotocol;
// header adds request headers (Origin ...). It returns the handshake error when the
// server refused.
func dial(t testing.TB, c *contract.Contract, base string, alloc uuid.UUID, token string, header http.Header) (*term, *http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, wsURL(base)+"/ws/terminal/"+alloc.String(), &websocket.DialOptions{
		HTTPClient:   &http.Client{Transport: checkingTransport{t: t, c: c}},
		HTTPHeader:   header,
		Subprotocols: []string{terminal.Subprotocol, terminal.TokenSubprotocolPrefix + token},
	})
	if err != nil {
		return nil, resp, err
	}
	ws.SetReadLimit(1 << 20)
	tm := &term{t: t, ws: ws, resp: resp, changed: make(chan struct{}, 1)}
	go tm.read()
	t.Cleanup(func() { _ = ws.CloseNow() })
	return tm, resp, nil
}

func (w *world) dial(t testing.TB, alloc uuid.UUID, token string) *term {
	t.Helper()
	tm, resp, err := dial(t, w.App.Contract, w.Server.URL, alloc, token, nil)
	if err != nil {
		body := ""
		if resp != nil {
			b, _ := io.ReadAll(resp.Body)
			body = string(b)
		}
		t.Fatalf("dial: %v %s", err, body)
	}
	return tm
}

func (tm *term) read() {
	for {
		typ, p, err := tm.ws.Read(context.Background())
		tm.mu.Lock()
		if err != nil {
			tm.readErr = err
		} else if typ == websocket.MessageBinary {
			tm.out.Write(p)
		} else {
			var m map[string]any
			if jerr := json.Unmarshal(p, &m); jerr != nil {
				tm.t.Errorf("text frame is not JSON: %q", p)
			}
			tm.ctls = append(tm.ctls, m)
		}
		tm.mu.Unlock()
		select {
		case tm.changed <- struct{}{}:
		default:
		}
		if err != nil {
			return
		}
	}
}

// wait polls cond (under the lock) until it holds.
func (tm *term) wait(what string, cond func() bool) {
	tm.t.Helper()
	deadline := time.NewTimer(waitLimit)
	defer deadline.Stop()
	for {
		tm.mu.Lock()
		ok := cond()
		tm.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-tm.changed:
		case <-time.After(50 * time.Millisecond):
		case <-deadline.C:
			tm.mu.Lock()
			defer tm.mu.Unlock()
			tm.t.Fatalf("timed out waiting for %s; output %q, controls %v, read error %v", what, tm.out.String(), tm.ctls, tm.readErr)
		}
	}
}

func (tm *term) waitOutput(s string) {
	tm.t.Helper()
	tm.wait(fmt.Sprintf("output %q", s), func() bool { return strings.Contains(tm.out.String(), s) })
}

// waitControl returns the first control message of type typ.
func (tm *term) waitControl(typ string) map[string]any {
	tm.t.Helper()
	var got map[string]any
	tm.wait("control "+typ, func() bool {
		for _, m := range tm.ctls {
			if m["type"] == typ {
				got = m
				return true
			}
		}
		return false
	})
	return got
}

// waitClosed waits until the server closed the WebSocket and returns the read error.
func (tm *term) waitClosed() error {
	tm.t.Helper()
	tm.wait("the WebSocket closed", func() bool { return tm.readErr != nil })
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.readErr
}

func (tm *term) output() string {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.out.String()
}

func (tm *term) send(s string) {
	tm.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := tm.ws.Write(ctx, websocket.MessageBinary, []byte(s)); err != nil {
		tm.t.Fatalf("send: %v", err)
	}
}

func (tm *term) control(v any) {
	tm.t.Helper()
	b, _ := json.Marshal(v)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := tm.ws.Write(ctx, websocket.MessageText, b); err != nil {
		tm.t.Fatalf("control: %v", err)
	}
}

// envelope reads a refused handshake's ErrorResponse and checks status, code, reason
// and the route and method the terminal gateway adds.
func envelope(t testing.TB, resp *http.Response, status int, code, reason string) api.ErrorResponse {
	t.Helper()
	if resp == nil {
		t.Fatalf("no response, want %d %s", status, code)
	}
	b, _ := io.ReadAll(resp.Body)
	var e api.ErrorResponse
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("body is not an envelope: %d %s", resp.StatusCode, b)
	}
	if resp.StatusCode != status || string(e.Code) != code || (reason != "" && e.Details["reason"] != reason) {
		t.Fatalf("got %d %s/%v, want %d %s/%s: %s", resp.StatusCode, e.Code, e.Details["reason"], status, code, reason, b)
	}
	if e.Details["route"] == nil || e.Details["method"] != "GET" || e.CorrelationID == "" {
		t.Fatalf("envelope lacks route/method/correlation id: %s", b)
	}
	return e
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

// secondReplica assembles another control plane (replica id) on w's database, NATS,
// events stream and presence bucket, serving its own HTTP API, as another replica of the
// same deployment would be.
func (w *world) secondReplica(t testing.TB, id string) (*app.App, *httptest.Server) {
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
	srv := httptest.NewServer(a.Handler)
	t.Cleanup(srv.Close)
	return a, srv
}

// metricValue is the value of the counter or gauge name{label=value} in a's registry (0
// when absent).
func metricValue(t testing.TB, a *app.App, name, label, value string) float64 {
	t.Helper()
	mfs, err := a.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					match = true
				}
			}
			if !match {
				continue
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}
