package notifications_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"
	"go.uber.org/goleak"
	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/controlplane/internal/notifications"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

// TestMain fails the package when a test leaves a goroutine behind (a hub, subscriber
// or WebSocket writer not stopped).
func TestMain(m *testing.M) { testenv.MainThen(m, func() error { return goleak.Find() }) }

const (
	h100   = "NVIDIA H100 80GB HBM3"
	region = "eu-west-1"
	sku1x  = "h100-80gb-sxm.1x"
	unit   = "gpu.h100"
	// barrier is the broadcast a test sends after the messages under test: messages from
	// one NATS connection reach a client in order, so whatever a client has not received
	// by the time it reads the barrier, it was not sent.
	barrier = "test.barrier"
)

// wait bounds every read and every eventual condition; it is a hang guard, not a timing
// assertion.
const wait = 20 * time.Second

// okDialer stands in for the node probe's network: test nodes live on addresses this
// machine does not have.
type okDialer struct{}

func (okDialer) DialContext(context.Context, string, string) (net.Conn, error) {
	c1, c2 := net.Pipe()
	_ = c2.Close()
	return c1, nil
}

// world: two tenants on one control plane. Acme (tenant 1) has alice (its admin, owner
// of the default project) and carol (a tenant member outside every project); Globex
// (tenant 2) has bob. Acme can launch an allocation.
type world struct {
	*apitest.Env
	Acme, Globex apitest.Tenant
	Alice        *api.ClientWithResponses
	CarolID      uuid.UUID
	CarolToken   string
	BobToken     string
}

func newEnv(t *testing.T, opts ...apitest.Option) *apitest.Env {
	t.Helper()
	return apitest.New(t, append([]apitest.Option{
		apitest.WithOptions(func(o *app.Options) { o.NodeProbeDialer = okDialer{} }),
	}, opts...)...)
}

func newWorld(t *testing.T, e *apitest.Env) *world {
	t.Helper()
	ctx := context.Background()
	_, rootTok := e.PlatformAdmin(t)
	root := e.Client(rootTok)
	state, isDefault := api.V3RegionAvailabilityState("available"), true
	if r, err := root.CreateRegionWithResponse(ctx, &api.CreateRegionParams{}, api.CreateRegionJSONRequestBody{
		Code: region, Label: "EU West", AvailabilityState: &state, IsDefault: &isDefault,
	}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("region: %v %s", err, r.Body)
	}
	if r, err := root.CreateSkuWithResponse(ctx, &api.CreateSkuParams{}, api.CreateSkuJSONRequestBody{
		ID: sku1x, GpuModel: h100, GpuCount: 1, Vcpu: 26, MemoryGib: 225, DiskGib: 2000, UsageUnit: unit, Regions: []string{region},
	}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("sku: %v %s", err, r.Body)
	}
	yes := true
	if r, err := root.CreateBillingPricingPlanWithResponse(ctx, &api.CreateBillingPricingPlanParams{}, api.BillingPricingPlanCreateRequest{
		Name: "standard", IsDefault: &yes, Prices: []api.BillingPrice{{UsageUnit: unit, Currency: "USD", UnitPrice: "0.001"}},
	}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("plan: %v %s", err, r.Body)
	}
	w := &world{Env: e}
	w.Acme = e.NewTenant(t, rootTok, "Acme")
	w.Globex = e.NewTenant(t, rootTok, "Globex")
	w.Alice = e.Client(w.Acme.AdminToken)
	w.CarolID, w.CarolToken = e.NewUser(t, w.Acme.AdminToken, "member")
	w.BobToken = w.Globex.AdminToken

	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Alice.CreateSSHKeyWithResponse(ctx, &api.CreateSSHKeyParams{}, api.CreateSSHKeyJSONRequestBody{
		Name: "laptop", PublicKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp))),
	}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("ssh key: %v %s", err, r.Body)
	}
	if r, err := root.CreateBillingAdjustmentWithResponse(ctx, &api.CreateBillingAdjustmentParams{}, api.BillingAdjustmentRequest{
		TenantID: w.Acme.ID, Amount: api.Money{AmountMinor: 1_000_000, Currency: "USD"}, Reason: "test credit",
	}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("credit: %v %s", err, r.Body)
	}
	w.node(t, "gpu-1")
	return w
}

var nodeSeq atomic.Int32

// node creates an online, schedulable one-GPU node through node administration's Go API.
func (w *world) node(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	reg := region
	n, err := w.App.Nodes.Create(ctx, nodes.Spec{Name: name, Address: fmt.Sprintf("10.9.0.%d", nodeSeq.Add(1)), Region: &reg})
	if err != nil {
		t.Fatalf("create node: %v", err)
	}
	inv := fleet.Inventory{AgentVersion: "1.0.0", Hostname: name, GPUs: []fleet.GPU{{
		Index: 0, UUID: "GPU-" + name, Model: h100, MemoryBytes: 81920 << 20, PCIBusID: "0000:01:00.0",
		DriverVersion: "550.54.15", CUDAVersion: "12.4",
	}}}
	if err := w.App.Nodes.NodeConnected(ctx, n.ID, inv, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := w.App.Nodes.NodeStatus(ctx, n.ID, true, time.Now()); err != nil {
		t.Fatal(err)
	}
}

// launch creates an allocation in Acme's default project through the API and has the
// outbox relay publish its events, as the running relay would.
func (w *world) launch(t *testing.T) api.Allocation {
	t.Helper()
	r, err := w.Alice.CreateAllocationWithResponse(context.Background(), &api.CreateAllocationParams{XProjectID: w.Acme.DefaultProject},
		api.CreateAllocationJSONRequestBody{Name: "train-1", Sku: sku1x})
	if err != nil || r.StatusCode() != 201 {
		t.Fatalf("create allocation: %v %s", err, r.Body)
	}
	drain(t, w.Env)
	return *r.JSON201
}

func drain(t *testing.T, e *apitest.Env) {
	t.Helper()
	if _, err := e.App.Relay.Drain(context.Background()); err != nil {
		t.Fatalf("relay: %v", err)
	}
}

// wsURL is the notifications socket of e.
func wsURL(e *apitest.Env) string {
	return "ws" + strings.TrimPrefix(e.Server.URL, "http") + notifications.Route
}

// dial opens the socket the way a browser does: the token as a subprotocol.
func dial(t *testing.T, e *apitest.Env, token string) *websocket.Conn {
	t.Helper()
	c, resp, err := dialWith(e, &websocket.DialOptions{Subprotocols: []string{notifications.Subprotocol, notifications.BearerProtocolPrefix + token}})
	if err != nil {
		t.Fatalf("dial: %v (%v)", err, resp)
	}
	t.Cleanup(func() { _ = c.CloseNow() })
	return c
}

func dialWith(e *apitest.Env, opts *websocket.DialOptions) (*websocket.Conn, *http.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, wsURL(e), opts)
	if err == nil {
		c.SetReadLimit(1 << 20)
	}
	return c, resp, err
}

// read returns the next message on c.
func read(t *testing.T, c *websocket.Conn) notifications.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	typ, data, err := c.Read(ctx)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if typ != websocket.MessageText {
		t.Fatalf("a %v message; notifications are text", typ)
	}
	var m notifications.Message
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("message %s: %v", data, err)
	}
	if m.SentAt.IsZero() || m.Data == nil {
		t.Fatalf("message %s lacks sent_at or data", data)
	}
	return m
}

// untilBarrier reads c up to and including the barrier with id and returns what came
// before it.
func untilBarrier(t *testing.T, c *websocket.Conn, id string) []notifications.Message {
	t.Helper()
	var got []notifications.Message
	for {
		m := read(t, c)
		if m.Type == barrier && m.Data["id"] == id {
			return got
		}
		got = append(got, m)
	}
}

// sendBarrier broadcasts a barrier from e's replica.
func sendBarrier(t *testing.T, e *apitest.Env) string {
	t.Helper()
	id := uuid.NewString()
	if err := e.App.Notifications.Broadcast(context.Background(), barrier, map[string]any{"id": id}); err != nil {
		t.Fatal(err)
	}
	return id
}

func types(ms []notifications.Message) []string {
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.Type)
	}
	return out
}

// eventually polls cond until it holds (a hang guard, not a timing assertion).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// handshake is a raw upgrade request through the contract-validating client, for the
// refusals (a 101 would hand the validator a body that never ends).
func handshake(e *apitest.Env, path string, headers map[string]string) *http.Request {
	req := e.Request(http.MethodGet, path, "", "")
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	req.Header.Set("Sec-WebSocket-Protocol", notifications.Subprotocol)
	for k, v := range headers {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	return req
}

// wantRefused checks an envelope refusal, with the route and method in details.
func wantRefused(t *testing.T, resp *http.Response, status int, code, reason string) {
	t.Helper()
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var env api.ErrorResponse
	if err := json.Unmarshal(body, &env); err != nil {
		t.Fatalf("%d %s: not an envelope: %v", resp.StatusCode, body, err)
	}
	if resp.StatusCode != status || string(env.Code) != code || (reason != "" && env.Details["reason"] != reason) {
		t.Fatalf("got %d %s/%v, want %d %s/%s: %s", resp.StatusCode, env.Code, env.Details["reason"], status, code, reason, body)
	}
	if env.Details["route"] != notifications.Route || env.Details["method"] != http.MethodGet || env.CorrelationID == "" {
		t.Errorf("details lack route, method or correlation: %s", body)
	}
}
