package provisioning_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/fabric/fabrictest"
	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/controlplane/internal/provisioning"
	"github.com/gantry-gpu/gantry/proto/api"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const (
	h100    = "NVIDIA H100 80GB HBM3"
	region  = "eu-west-1"
	sku1x   = "h100-80gb-sxm.1x"
	unit    = "gpu.h100"
	timeout = 10 * time.Minute // GANTRY_PROVISIONING_TIMEOUT of these tests
)

// okDialer stands in for the node probe's network: the nodes of these tests live on
// private addresses this machine does not have.
type okDialer struct{}

func (okDialer) DialContext(context.Context, string, string) (net.Conn, error) {
	c1, c2 := net.Pipe()
	_ = c2.Close()
	return c1, nil
}

// world is a running control plane (API, outbox relay, fabric) with a region, a 1-GPU
// H100 SKU, and a tenant (acme) whose admin has an SSH key and a funded wallet. The
// dispatchers it starts run on Clock, a manual clock the tests move past deadlines.
type world struct {
	*apitest.Env
	Root  *api.ClientWithResponses
	Acme  apitest.Tenant
	Alice *api.ClientWithResponses
	Key   string // alice's SSH public key
	Clock *clock.Manual
	ctx   context.Context
}

func newWorld(t *testing.T) *world {
	t.Helper()
	e := apitest.New(t,
		apitest.WithOptions(func(o *app.Options) { o.NodeProbeDialer = okDialer{} }),
		apitest.WithConfig(func(c *app.Config) { c.Allocations.ProvisioningTimeout = timeout }),
	)
	ctx, cancel := context.WithCancel(context.Background())
	w := &world{Env: e, Clock: clock.NewManual(time.Now()), ctx: ctx}
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Add(1)
	go func() { defer wg.Done(); _ = e.App.Fabric.Run(ctx) }()
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	if err := e.App.Fabric.WaitPresence(wctx); err != nil {
		t.Fatal(err)
	}

	_, rootTok := e.PlatformAdmin(t)
	w.Root = e.Client(rootTok)
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
	isDefaultPlan := true
	if r, err := w.Root.CreateBillingPricingPlanWithResponse(ctx, &api.CreateBillingPricingPlanParams{}, api.BillingPricingPlanCreateRequest{
		Name: "standard", IsDefault: &isDefaultPlan, Prices: []api.BillingPrice{{UsageUnit: unit, Currency: "USD", UnitPrice: "0.001"}},
	}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("plan: %v %s", err, r.Body)
	}
	w.Acme = e.NewTenant(t, rootTok, "Acme")
	w.Alice = e.Client(w.Acme.AdminToken)
	if r, err := w.Root.CreateBillingAdjustmentWithResponse(ctx, &api.CreateBillingAdjustmentParams{},
		api.BillingAdjustmentRequest{TenantID: w.Acme.ID, Amount: api.Money{AmountMinor: 1_000_000, Currency: "USD"}, Reason: "test credit"}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("credit: %v %s", err, r.Body)
	}
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	w.Key = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp)))
	if r, err := w.Alice.CreateSSHKeyWithResponse(ctx, &api.CreateSSHKeyParams{}, api.CreateSSHKeyJSONRequestBody{Name: "laptop", PublicKey: w.Key}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("ssh key: %v %s", err, r.Body)
	}
	return w
}

// relay publishes the outbox (dispatch messages included) until the test ends.
func (w *world) relay(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = w.App.Relay.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// dispatcher starts a dispatcher on the app's stream (a replica: several share the
// consumer) with fast retries, on w.Clock and a registry of its own.
func (w *world) dispatcher(t *testing.T) (*provisioning.Dispatcher, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := provisioning.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	cfg := w.App.Provisioning.Config()
	cfg.BackoffMin, cfg.BackoffMax, cfg.AttemptTimeout, cfg.DepthInterval = 20*time.Millisecond, 100*time.Millisecond, 5*time.Second, time.Hour
	d := provisioning.New(w.App.JS, w.App.Allocations, w.App.Fabric, w.Clock, cfg, m, w.App.Log)
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return d, reg
}

var nodeSeq atomic.Int32

// simAgent is a simulated node agent that records what it was sent.
type simAgent struct {
	*fabrictest.Agent
	mu    sync.Mutex
	tasks []*fabricv1.TaskDispatch
	acks  []fabricv1.TaskAckStatus
	seen  map[string]bool
	// refuse, when set, answers REJECTED with this code.
	refuse string
	stop   context.CancelFunc
	done   chan struct{}
}

func (a *simAgent) onTask(t *fabricv1.TaskDispatch) *fabricv1.TaskAck {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.tasks = append(a.tasks, t)
	ack := &fabricv1.TaskAck{TaskId: t.GetTaskId(), Status: fabricv1.TaskAckStatus_TASK_ACK_STATUS_ACCEPTED}
	switch {
	case a.refuse != "":
		ack.Status, ack.ErrorCode, ack.Message = fabricv1.TaskAckStatus_TASK_ACK_STATUS_REJECTED, a.refuse, "GPU 0 is held by another workload"
	case a.seen[t.GetTaskId()]:
		ack.Status = fabricv1.TaskAckStatus_TASK_ACK_STATUS_DUPLICATE
	}
	a.seen[t.GetTaskId()] = true
	a.acks = append(a.acks, ack.Status)
	return ack
}

// received is what the agent was sent so far, and how it answered.
func (a *simAgent) received() ([]*fabricv1.TaskDispatch, []fabricv1.TaskAckStatus) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]*fabricv1.TaskDispatch(nil), a.tasks...), append([]fabricv1.TaskAckStatus(nil), a.acks...)
}

// enroll creates a node in the region and enrolls it; it returns the id and node token.
func (w *world) enroll(t *testing.T, name string) (uuid.UUID, string) {
	t.Helper()
	reg := region
	n, err := w.App.Nodes.Create(w.ctx, nodes.Spec{Name: name, Address: fmt.Sprintf("10.9.0.%d", nodeSeq.Add(1)), Region: &reg})
	if err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	et, err := w.App.Nodes.IssueEnrollmentToken(w.ctx, n.ID)
	if err != nil {
		t.Fatal(err)
	}
	en, err := w.App.Nodes.Enroll(w.ctx, et.Token, name, "sim/1")
	if err != nil {
		t.Fatal(err)
	}
	return n.ID, en.NodeToken
}

// agent connects a simulated agent with gpus H100s for the node and waits until the
// node is online; stop disconnects it (the node is offline for the fabric at once).
func (w *world) agent(t *testing.T, node uuid.UUID, token string, gpus int) *simAgent {
	t.Helper()
	a := &simAgent{seen: map[string]bool{}}
	a.Agent = fabrictest.NewAgent(w.App.Fabric.ListenAddr().String(), token, w.App.Fabric.CAPEM(), fabricnet.ModeTCP)
	a.BackoffMin, a.BackoffMax = 50*time.Millisecond, 500*time.Millisecond
	a.OnTask = a.onTask
	a.Inventory = &fabricv1.Inventory{}
	for i := 0; i < gpus; i++ {
		a.Inventory.Gpus = append(a.Inventory.Gpus, &fabricv1.GPU{
			Index: uint32(i), Uuid: fmt.Sprintf("GPU-%s-%d", node.String()[:8], i), Model: h100, MemoryBytes: 80 << 30,
			DriverVersion: "550.54.15", CudaVersion: "12.4", PciBusId: fmt.Sprintf("00000000:%02x:00.0", i+0x18),
			MigMode: fabricv1.MIGMode_MIG_MODE_DISABLED,
		})
	}
	ctx, cancel := context.WithCancel(w.ctx)
	a.stop, a.done = cancel, make(chan struct{})
	go func() { defer close(a.done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-a.done })
	select {
	case <-a.Sessions:
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not connect")
	}
	eventually(t, "node online with its GPUs", func() bool {
		n, err := w.App.Nodes.Get(w.ctx, node)
		return err == nil && n.Status == nodes.StatusOnline && len(n.GPUs) > 0
	})
	return a
}

// disconnect stops the agent and waits until the fabric holds no tunnel (the node
// stays online in the directory until its heartbeat TTL; Dispatch answers
// ErrNodeOffline at once).
func (w *world) disconnect(t *testing.T, a *simAgent) {
	t.Helper()
	a.stop()
	<-a.done
	eventually(t, "tunnel gone", func() bool { return w.App.Fabric.LocalSessions() == 0 })
}

// offlineNode is a schedulable node the directory believes online, with no tunnel: the
// fabric answers ErrNodeOffline for it.
func (w *world) offlineNode(t *testing.T, name string) uuid.UUID {
	t.Helper()
	reg := region
	n, err := w.App.Nodes.Create(w.ctx, nodes.Spec{Name: name, Address: fmt.Sprintf("10.9.1.%d", nodeSeq.Add(1)), Region: &reg})
	if err != nil {
		t.Fatal(err)
	}
	inv := fleet.Inventory{AgentVersion: "1.0.0", Hostname: name, GPUs: []fleet.GPU{{
		Index: 0, UUID: "GPU-" + name + "-0", Model: h100, MemoryBytes: 81920 << 20, PCIBusID: "0000:18:00.0",
		DriverVersion: "550.54.15", CUDAVersion: "12.4",
	}}}
	if err := w.App.Nodes.NodeConnected(w.ctx, n.ID, inv, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := w.App.Nodes.NodeStatus(w.ctx, n.ID, true, time.Now()); err != nil {
		t.Fatal(err)
	}
	return n.ID
}

// create launches an allocation as alice with requestID as its X-Request-Id.
func (w *world) create(t *testing.T, name, requestID string) api.Allocation {
	t.Helper()
	r, err := w.Alice.CreateAllocationWithResponse(w.ctx, &api.CreateAllocationParams{XProjectID: w.Acme.DefaultProject},
		api.CreateAllocationJSONRequestBody{Name: name, Sku: sku1x},
		func(_ context.Context, req *http.Request) error {
			if requestID != "" {
				req.Header.Set("X-Request-Id", requestID)
			}
			return nil
		})
	if err != nil || r.StatusCode() != 201 {
		t.Fatalf("create: %v %s", err, r.Body)
	}
	return *r.JSON201
}

func (w *world) get(t *testing.T, id uuid.UUID) api.Allocation {
	t.Helper()
	g, err := w.Alice.GetAllocationWithResponse(w.ctx, id, &api.GetAllocationParams{XProjectID: w.Acme.DefaultProject})
	if err != nil || g.StatusCode() != 200 {
		t.Fatalf("get: %v %s", err, g.Body)
	}
	return *g.JSON200
}

// waitStatus polls the allocation until it has status.
func (w *world) waitStatus(t *testing.T, id uuid.UUID, status string) api.Allocation {
	t.Helper()
	var a api.Allocation
	eventually(t, "allocation "+status, func() bool {
		a = w.get(t, id)
		return string(a.Status) == status
	})
	return a
}

func (w *world) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := w.Pool.QueryRow(w.ctx, sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// task is the allocation's latest task of kind.
type taskRow struct {
	ID        uuid.UUID
	CreatedAt time.Time
	AckedAt   *time.Time
	Finished  *time.Time
	Attempts  int
	LastError *string
}

func (w *world) task(t *testing.T, alloc uuid.UUID, kind string) taskRow {
	t.Helper()
	var r taskRow
	if err := w.Pool.QueryRow(w.ctx, `SELECT task_id, created_at, acked_at, finished_at, attempts, last_error FROM allocation_tasks
		WHERE allocation_id = $1 AND kind = $2 ORDER BY created_at DESC, task_id DESC LIMIT 1`, alloc, kind).
		Scan(&r.ID, &r.CreatedAt, &r.AckedAt, &r.Finished, &r.Attempts, &r.LastError); err != nil {
		t.Fatalf("task %s of %s: %v", kind, alloc, err)
	}
	return r
}

// drained waits until every published dispatch message was acknowledged (the
// work-queue stream removes a message on its ack): whatever handling they caused is over.
func (w *world) drained(t *testing.T) {
	t.Helper()
	cfg := w.App.Provisioning.Config()
	eventually(t, "provisioning stream drained", func() bool {
		s, err := w.App.JS.Stream(w.ctx, cfg.Stream)
		if err != nil {
			return false
		}
		info, err := s.Info(w.ctx)
		if err != nil {
			return false
		}
		pending := w.count(t, `SELECT count(*) FROM outbox_events WHERE event_type = 'provisioning.dispatch' AND published_at IS NULL`)
		return info.State.Msgs == 0 && pending == 0
	})
}

// publish puts a dispatch message on the stream by hand (a redelivery).
func (w *world) publish(t *testing.T, data []byte) {
	t.Helper()
	if _, err := w.App.JS.Publish(w.ctx, w.App.Provisioning.Config().Subject(), data, jetstream.WithMsgID(uuid.NewString())); err != nil {
		t.Fatal(err)
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
