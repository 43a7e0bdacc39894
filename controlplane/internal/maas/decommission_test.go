package maas_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	"github.com/gantry-gpu/gantry/controlplane/internal/maas/maastest"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/proto/api"
)

// okDialer stands in for the node probe's network: the simulated machines live on
// addresses this host does not have.
type okDialer struct{}

func (okDialer) DialContext(context.Context, string, string) (net.Conn, error) {
	c1, c2 := net.Pipe()
	_ = c2.Close()
	return c1, nil
}

var tokenRE = regexp.MustCompile(`gne_[A-Za-z0-9_-]{43}`)

// enrollingBooter is the first boot of a deployed machine as far as the control plane
// sees it: the enrollment token from the user data is traded for a node token
// (POST /api/v1/internal/nodes/enroll's service call) and the agent's hello reports 8
// H100s. (maastest.AgentBooter runs the real agent package; these tests keep to the
// control plane's side.)
func enrollingBooter(e *apitest.Env) maastest.Booter {
	return maastest.BooterFunc(func(ctx context.Context, req maastest.BootRequest) (maastest.Instance, string, error) {
		tok := tokenRE.FindString(string(req.UserData))
		if tok == "" {
			return nil, "", fmt.Errorf("no enrollment token in the user data")
		}
		enr, err := e.App.Nodes.Enroll(ctx, tok, req.Hostname, "1.0.0")
		if err != nil {
			return nil, "", err
		}
		inv := fleet.Inventory{AgentVersion: "1.0.0", Hostname: req.Hostname}
		for i := range 8 {
			inv.GPUs = append(inv.GPUs, fleet.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", req.SystemID, i), Model: "NVIDIA H100 80GB HBM3",
				MemoryBytes: 81920 << 20, PCIBusID: fmt.Sprintf("0000:%02x:00.0", i), DriverVersion: "550.54.15", CUDAVersion: "12.4"})
		}
		if err := e.App.Nodes.NodeConnected(ctx, enr.NodeID, inv, time.Now()); err != nil {
			return nil, "", err
		}
		if err := e.App.Nodes.NodeStatus(ctx, enr.NodeID, true, time.Now()); err != nil {
			return nil, "", err
		}
		return nil, "", nil
	})
}

// onboarded runs a full onboarding to succeeded and returns it.
func (f *fixture) onboarded(t *testing.T) (api.MaasOnboarding, string) {
	t.Helper()
	sys := f.sim.AddMachine(maastest.MachineSpec{})
	r := f.onboard(t, sys)
	if r.StatusCode() != http.StatusAccepted {
		t.Fatalf("onboard: %d %s", r.StatusCode(), r.Body)
	}
	o := f.waitFor(t, *r.JSON202, func(o api.MaasOnboarding) bool {
		return o.State == api.MaasWorkflowStateSucceeded || o.State == api.MaasWorkflowStateFailed
	})
	if o.State != api.MaasWorkflowStateSucceeded {
		t.Fatalf("onboarding %s at %s: %s", o.State, deref(o.CurrentStep), deref(o.FailureReason))
	}
	return o, sys
}

func (f *fixture) decommission(t *testing.T, nodeID uuid.UUID, body api.CreateNodeDecommissionJSONRequestBody) *api.CreateNodeDecommissionHTTPResponse {
	t.Helper()
	r, err := f.admin.CreateNodeDecommissionWithResponse(context.Background(), nodeID, &api.CreateNodeDecommissionParams{}, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (f *fixture) waitDecommission(t *testing.T, id uuid.UUID) api.MaasDecommission {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, err := f.admin.GetMaasDecommissionWithResponse(context.Background(), id, &api.GetMaasDecommissionParams{})
		if err != nil || r.JSON200 == nil {
			t.Fatalf("get decommission: %v", err)
		}
		d := *r.JSON200
		if d.State == api.MaasWorkflowStateSucceeded || d.State == api.MaasWorkflowStateFailed {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("decommission stuck at %s (%s): %+v", deref(d.CurrentStep), deref(d.Steps[1].Reason), d.Steps)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The whole path: onboarding ends with the node online, uncordoned and allocatable (an
// allocation is placed on it); decommissioning it while the allocation runs needs a
// drain deadline, after which the allocation is force-released, the token revoked, the
// machine released with quick erase back to Ready in MAAS, and the node retired.
func TestOnboardAllocateDecommission(t *testing.T) {
	f := setupWith(t, enrollingBooter)
	o, sys := f.onboarded(t)
	if n := f.e.Count(t, `SELECT count(*) FROM nodes WHERE id = $1 AND schedule_state = 'schedulable' AND status = 'online'`, *o.NodeID); n != 1 {
		t.Fatal("onboarded node is not online and schedulable")
	}
	for _, s := range o.Steps {
		if s.State != api.MaasWorkflowStepStateSucceeded && s.State != api.MaasWorkflowStepStateSkipped {
			t.Errorf("step %s ended %s", s.Name, s.State)
		}
	}

	// An allocation is placed on it.
	placeAllocation(t, f, *o.NodeID)

	// Running allocations and no deadline: 409 node_in_use, nothing stored.
	r := f.decommission(t, *o.NodeID, api.CreateNodeDecommissionJSONRequestBody{})
	if r.StatusCode() != http.StatusConflict || r.JSON409 == nil || r.JSON409.Code != api.ErrorCodeNodeInUse {
		t.Fatalf("decommission without deadline: %d %s", r.StatusCode(), r.Body)
	}
	if n := f.e.Count(t, `SELECT count(*) FROM maas_decommissions`); n != 0 {
		t.Fatalf("a refused decommission was stored")
	}
	deadline := time.Now().Add(200 * time.Millisecond)
	r = f.decommission(t, *o.NodeID, api.CreateNodeDecommissionJSONRequestBody{DrainDeadline: &deadline})
	if r.StatusCode() != http.StatusAccepted {
		t.Fatalf("decommission: %d %s", r.StatusCode(), r.Body)
	}
	// A second one while it runs: 409.
	if r2 := f.decommission(t, *o.NodeID, api.CreateNodeDecommissionJSONRequestBody{DrainDeadline: &deadline}); r2.StatusCode() != http.StatusConflict {
		t.Errorf("second decommission: %d", r2.StatusCode())
	}
	d := f.waitDecommission(t, r.JSON202.ID)
	if d.State != api.MaasWorkflowStateSucceeded {
		t.Fatalf("decommission %s at %s: %s", d.State, deref(d.CurrentStep), deref(d.FailureReason))
	}
	if d.Erase != api.MaasDecommissionEraseQuick || d.SystemID == nil || *d.SystemID != sys {
		t.Errorf("decommission erase %s system %v", d.Erase, d.SystemID)
	}
	if n := f.e.Count(t, `SELECT count(*) FROM allocation_gpus WHERE node_id = $1 AND released_at IS NULL`, *o.NodeID); n != 0 {
		t.Errorf("%d GPUs still held after the drain deadline", n)
	}
	if n := f.e.Count(t, `SELECT count(*) FROM nodes WHERE id = $1`, *o.NodeID); n != 0 {
		t.Errorf("node not retired")
	}
	if m, ok := f.sim.Machine(sys); !ok || m.Status != maastest.StatusReady {
		t.Errorf("machine after release: %+v", m)
	}
	released := 0
	for _, c := range f.sim.Calls() {
		if c.Op == "release" && c.SystemID == sys && c.Status < 300 {
			released++
		}
	}
	if released != 1 {
		t.Errorf("release calls %d, want 1", released)
	}
}

// A node without allocations decommissions without a deadline; a node that did not come
// through MAAS skips the release step.
func TestDecommissionIdleNodeWithoutMAAS(t *testing.T) {
	f := setup(t)
	reg := "rack-a"
	n, err := f.e.App.Nodes.Create(context.Background(), nodesSpec("plain-1", "10.9.0.1", &reg))
	if err != nil {
		t.Fatal(err)
	}
	r := f.decommission(t, n.ID, api.CreateNodeDecommissionJSONRequestBody{})
	if r.StatusCode() != http.StatusAccepted {
		t.Fatalf("decommission: %d %s", r.StatusCode(), r.Body)
	}
	d := f.waitDecommission(t, r.JSON202.ID)
	if d.State != api.MaasWorkflowStateSucceeded {
		t.Fatalf("decommission %s: %s", d.State, deref(d.FailureReason))
	}
	if d.Steps[3].Name != "release" || d.Steps[3].State != api.MaasWorkflowStepStateSkipped {
		t.Errorf("release step: %+v", d.Steps[3])
	}
	if c := f.e.Count(t, `SELECT count(*) FROM nodes WHERE id = $1`, n.ID); c != 0 {
		t.Error("node not retired")
	}
}

func nodesSpec(name, addr string, region *string) nodes.Spec {
	return nodes.Spec{Name: name, Address: addr, Region: region}
}

// Quick erase by default; secure erase on request (what MAAS was asked for is checked).
func TestDecommissionEraseModes(t *testing.T) {
	f := setupWith(t, enrollingBooter)
	for _, tc := range []struct {
		erase *api.CreateDecommissionRequestErase
		want  string
	}{{nil, "quick"}, {ptrTo(api.CreateDecommissionRequestEraseSecure), "secure"}} {
		o, sys := f.onboarded(t)
		r := f.decommission(t, *o.NodeID, api.CreateNodeDecommissionJSONRequestBody{Erase: tc.erase})
		if r.StatusCode() != http.StatusAccepted {
			t.Fatalf("decommission: %d %s", r.StatusCode(), r.Body)
		}
		if d := f.waitDecommission(t, r.JSON202.ID); d.State != api.MaasWorkflowStateSucceeded || string(d.Erase) != tc.want {
			t.Fatalf("decommission %s erase %s: %s", d.State, d.Erase, deref(d.FailureReason))
		}
		if m, _ := f.sim.Machine(sys); m.LastErase != tc.want || m.Status != maastest.StatusReady {
			t.Errorf("MAAS erased %q (status %s), want %q", m.LastErase, m.Status, tc.want)
		}
	}
}

func ptrTo[T any](v T) *T { return &v }

// placeAllocation creates a 1-GPU SKU, a pricing plan and a tenant with credit and an
// SSH key, and an allocation that must land on nodeID (the only node with GPUs).
func placeAllocation(t *testing.T, f *fixture, nodeID uuid.UUID) (*api.ClientWithResponses, api.Allocation) {
	t.Helper()
	ctx := context.Background()
	sku1 := "h100-80gb.1x"
	if r, err := f.admin.CreateSkuWithResponse(ctx, &api.CreateSkuParams{}, api.CreateSkuJSONRequestBody{ID: sku1, GpuModel: "NVIDIA H100 80GB HBM3",
		GpuCount: 1, Vcpu: 8, MemoryGib: 64, DiskGib: 200, UsageUnit: "gpu_second.h100", Regions: []string{"rack-a"}}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("sku: %v %s", err, r.Body)
	}
	isDefault := true
	if r, err := f.admin.CreateBillingPricingPlanWithResponse(ctx, &api.CreateBillingPricingPlanParams{}, api.BillingPricingPlanCreateRequest{
		Name: "standard", IsDefault: &isDefault, Prices: []api.BillingPrice{{UsageUnit: "gpu_second.h100", Currency: "USD", UnitPrice: "0.001"}},
	}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("plan: %v %s", err, r.Body)
	}
	_, rootTok := f.e.PlatformAdmin(t)
	acme := f.e.NewTenant(t, rootTok, "Acme")
	alice := f.e.Client(acme.AdminToken)
	if r, err := f.admin.CreateBillingAdjustmentWithResponse(ctx, &api.CreateBillingAdjustmentParams{},
		api.BillingAdjustmentRequest{TenantID: acme.ID, Amount: api.Money{AmountMinor: 1_000_000, Currency: "USD"}, Reason: "test credit"}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("credit: %v %s", err, r.Body)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	sp, _ := ssh.NewPublicKey(pub)
	if r, err := alice.CreateSSHKeyWithResponse(ctx, &api.CreateSSHKeyParams{}, api.CreateSSHKeyJSONRequestBody{Name: "laptop",
		PublicKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp)))}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("ssh key: %v %s", err, r.Body)
	}
	ar, err := alice.CreateAllocationWithResponse(ctx, &api.CreateAllocationParams{XProjectID: acme.DefaultProject}, api.CreateAllocationJSONRequestBody{Name: "train", Sku: sku1})
	if err != nil || ar.StatusCode() != 201 {
		t.Fatalf("allocation: %v %s", err, ar.Body)
	}
	if n := f.e.Count(t, `SELECT count(*) FROM allocation_gpus WHERE node_id = $1 AND released_at IS NULL`, nodeID); n != 1 {
		t.Fatalf("the allocation is not on the onboarded node (%d GPUs held there)", n)
	}

	return alice, *ar.JSON201
}
