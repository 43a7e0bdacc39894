package allocations_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const (
	h100   = "NVIDIA H100 80GB HBM3"
	region = "eu-west-1"
	sku1x  = "h100-80gb-sxm.1x"
	unit   = "gpu.h100"
)

// okDialer stands in for the network of the node probe: the nodes of these tests live
// on private addresses this machine does not have. Every dial "connects".
type okDialer struct{}

func (okDialer) DialContext(context.Context, string, string) (net.Conn, error) {
	c1, c2 := net.Pipe()
	_ = c2.Close()
	return c1, nil
}

// world is a control plane with a region, a 1-GPU H100 SKU priced by the default plan,
// and a tenant (acme) whose admin has an SSH key and a funded wallet.
type world struct {
	*apitest.Env
	Root  *api.ClientWithResponses
	Acme  apitest.Tenant
	Alice *api.ClientWithResponses // acme's tenant admin
}

func newWorld(t *testing.T, maxPerProject int) *world {
	t.Helper()
	return newWorldWith(t, maxPerProject)
}

// newWorldWith is newWorld with more options (a manual clock, configuration).
func newWorldWith(t *testing.T, maxPerProject int, opts ...apitest.Option) *world {
	t.Helper()
	e := apitest.New(t, append([]apitest.Option{
		apitest.WithOptions(func(o *app.Options) { o.NodeProbeDialer = okDialer{} }),
		apitest.WithConfig(func(c *app.Config) { c.Allocations.MaxPerProject = maxPerProject }),
	}, opts...)...)
	ctx := context.Background()
	_, rootTok := e.PlatformAdmin(t)
	w := &world{Env: e, Root: e.Client(rootTok)}
	state, isDefault := api.V3RegionAvailabilityState("available"), true
	if r, err := w.Root.CreateRegionWithResponse(ctx, &api.CreateRegionParams{}, api.CreateRegionJSONRequestBody{
		Code: region, Label: "EU West", AvailabilityState: &state, IsDefault: &isDefault,
	}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("region: %v %s", err, r.Body)
	}
	w.sku(t, sku1x, 1)
	if r, err := w.Root.CreateBillingPricingPlanWithResponse(ctx, &api.CreateBillingPricingPlanParams{}, api.BillingPricingPlanCreateRequest{
		Name: "standard", IsDefault: ptr(true), Prices: []api.BillingPrice{{UsageUnit: unit, Currency: "USD", UnitPrice: "0.001"}},
	}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("plan: %v %s", err, r.Body)
	}
	w.Acme = e.NewTenant(t, rootTok, "Acme")
	w.Alice = e.Client(w.Acme.AdminToken)
	w.addKey(t, w.Alice)
	w.credit(t, w.Acme.ID, 1_000_000)
	return w
}

func ptr[T any](v T) *T { return &v }

func (w *world) sku(t *testing.T, id string, gpus int) {
	t.Helper()
	r, err := w.Root.CreateSkuWithResponse(context.Background(), &api.CreateSkuParams{}, api.CreateSkuJSONRequestBody{
		ID: id, GpuModel: h100, GpuCount: gpus, Vcpu: 26 * gpus, MemoryGib: 225 * gpus, DiskGib: 2000,
		UsageUnit: unit, Regions: []string{region},
	})
	if err != nil || r.StatusCode() != 201 {
		t.Fatalf("sku: %v %s", err, r.Body)
	}
}

func (w *world) credit(t *testing.T, tenant uuid.UUID, minor int64) {
	t.Helper()
	r, err := w.Root.CreateBillingAdjustmentWithResponse(context.Background(), &api.CreateBillingAdjustmentParams{},
		api.BillingAdjustmentRequest{TenantID: tenant, Amount: api.Money{AmountMinor: minor, Currency: "USD"}, Reason: "test credit"})
	if err != nil || r.StatusCode() != 201 {
		t.Fatalf("credit: %v %s", err, r.Body)
	}
}

func (w *world) addKey(t *testing.T, c *api.ClientWithResponses) uuid.UUID {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp)))
	r, err := c.CreateSSHKeyWithResponse(context.Background(), &api.CreateSSHKeyParams{}, api.CreateSSHKeyJSONRequestBody{Name: "laptop", PublicKey: line})
	if err != nil || r.StatusCode() != 201 {
		t.Fatalf("ssh key: %v %s", err, r.Body)
	}
	return r.JSON201.ID
}

var nodeSeq atomic.Int32

// node creates an online, schedulable node of region with gpus H100s, through node
// administration's Go API and the fabric's Directory calls.
func (w *world) node(t *testing.T, name string, gpus int) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	reg := region
	n, err := w.App.Nodes.Create(ctx, nodes.Spec{Name: name, Address: fmt.Sprintf("10.7.0.%d", nodeSeq.Add(1)), Region: &reg})
	if err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	inv := fleet.Inventory{AgentVersion: "1.0.0", Hostname: name}
	for i := 0; i < gpus; i++ {
		inv.GPUs = append(inv.GPUs, fleet.GPU{
			Index: i, UUID: fmt.Sprintf("GPU-%s-%d", name, i), Model: h100, MemoryBytes: 81920 << 20,
			PCIBusID: fmt.Sprintf("0000:%02x:00.0", i), DriverVersion: "550.54.15", CUDAVersion: "12.4",
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

func (w *world) create(c *api.ClientWithResponses, project uuid.UUID, key string, body api.CreateAllocationJSONRequestBody) (*api.CreateAllocationHTTPResponse, error) {
	p := &api.CreateAllocationParams{XProjectID: project}
	if key != "" {
		p.IdempotencyKey = &key
	}
	return c.CreateAllocationWithResponse(context.Background(), p, body)
}

func (w *world) mustCreate(t *testing.T, name string) api.Allocation {
	t.Helper()
	r, err := w.create(w.Alice, w.Acme.DefaultProject, "", api.CreateAllocationJSONRequestBody{Name: name, Sku: sku1x})
	if err != nil || r.StatusCode() != 201 {
		t.Fatalf("create: %v %s", err, r.Body)
	}
	return *r.JSON201
}

func wantError(t *testing.T, body []byte, got, status int, code, reason string) {
	t.Helper()
	var e api.ErrorResponse
	_ = json.Unmarshal(body, &e)
	if got != status || string(e.Code) != code || (reason != "" && e.Details["reason"] != reason) {
		t.Fatalf("got %d %s/%v, want %d %s/%s: %s", got, e.Code, e.Details["reason"], status, code, reason, body)
	}
}

func (w *world) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := w.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// writes counts everything a create writes: allocations, their GPUs, status events and
// agent tasks, and the allocation outbox events and audit rows.
func (w *world) writes(t *testing.T) [6]int {
	t.Helper()
	return [6]int{
		w.count(t, `SELECT count(*) FROM allocation_tasks`),
		w.count(t, `SELECT count(*) FROM allocations`),
		w.count(t, `SELECT count(*) FROM allocation_gpus`),
		w.count(t, `SELECT count(*) FROM allocation_events`),
		w.count(t, `SELECT count(*) FROM outbox_events WHERE event_type LIKE 'allocation.%'`),
		w.count(t, `SELECT count(*) FROM audit_events WHERE action LIKE 'allocation.%'`),
	}
}
