package e2e_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/fabric"
	"github.com/gantry-gpu/gantry/nodeagent/config"
	"github.com/gantry-gpu/gantry/proto/api"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/alloctask"
)

const (
	e2eRegion = "e2e-1"
	e2eSKU    = "h100-80gb-sxm.1x"
	e2eUnit   = "gpu.h100"
)

// runBackground runs the serving app's outbox relay and provisioning dispatcher (the
// harness runs only the fabric), until the test ends.
func (c *cp) runBackground(a *app.App) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { _ = a.Relay.Run(ctx); done <- struct{}{} }()
	go func() { _ = a.Provisioning.Run(ctx); done <- struct{}{} }()
	c.t.Cleanup(func() { cancel(); <-done; <-done })
}

// catalogForAllocations creates the region, a 1×H100 SKU and its price through the
// admin API.
func (c *cp) catalogForAllocations() {
	c.t.Helper()
	ctx := context.Background()
	state, isDefault := api.V3RegionAvailabilityState("available"), true
	if r, err := c.client().CreateRegionWithResponse(ctx, &api.CreateRegionParams{}, api.CreateRegionJSONRequestBody{
		Code: e2eRegion, Label: "E2E", AvailabilityState: &state, IsDefault: &isDefault,
	}); err != nil || r.StatusCode() != 201 {
		c.t.Fatalf("region: %v %s", err, r.Body)
	}
	if r, err := c.client().CreateSkuWithResponse(ctx, &api.CreateSkuParams{}, api.CreateSkuJSONRequestBody{
		ID: e2eSKU, GpuModel: "NVIDIA H100 80GB HBM3", GpuCount: 1, Vcpu: 26, MemoryGib: 225, DiskGib: 2000,
		UsageUnit: e2eUnit, Regions: []string{e2eRegion},
	}); err != nil || r.StatusCode() != 201 {
		c.t.Fatalf("sku: %v %s", err, r.Body)
	}
	isDef := true
	if r, err := c.client().CreateBillingPricingPlanWithResponse(ctx, &api.CreateBillingPricingPlanParams{}, api.BillingPricingPlanCreateRequest{
		Name: "e2e", IsDefault: &isDef, Prices: []api.BillingPrice{{UsageUnit: e2eUnit, Currency: "USD", UnitPrice: "0.001"}},
	}); err != nil || r.StatusCode() != 201 {
		c.t.Fatalf("plan: %v %s", err, r.Body)
	}
}

// TestAllocationLifecycleWithAgentProcess is issue 5's full lifecycle against the real
// gantry-nodeagent binary on the mock DGX H100 with the process runtime: create →
// dispatched → provisioning → active (the agent's workspace holds the user's key and
// only the allocated GPU) → released (the workspace is gone, the GPU free, billing
// closed). Then a control-plane restart, after which the same task delivered again is
// answered DUPLICATE and changes nothing.
func TestAllocationLifecycleWithAgentProcess(t *testing.T) {
	c := startCP(t)
	c.runBackground(c.app)
	c.catalogForAllocations()
	ctx := context.Background()

	// The node, in the region, enrolled and run as `gantry-nodeagent run`.
	nodeID, tok := c.newNode("gpu-alloc-1")
	region := e2eRegion
	if r, err := c.client().UpdateNodeWithResponse(ctx, nodeID, &api.UpdateNodeParams{}, api.UpdateNodeJSONRequestBody{Region: &region}); err != nil || r.StatusCode() != 200 {
		t.Fatalf("node region: %v %s", err, r.Body)
	}
	e := c.enrollAgent(tok, "gpu-alloc-1")
	e.cfg.Runtime = "process"
	e.cfg.StateDir = filepath.Join(filepath.Dir(e.cfg.Path), "state")
	e.cfg.AdvertiseHost = "gpu-alloc-1.example"
	if err := config.Save(e.cfg.Path, e.cfg); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	run := exec.Command(buildAgent(t), "run", "--config", e.cfg.Path)
	run.Stdout, run.Stderr = &logs, &logs
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = run.Process.Signal(syscall.SIGTERM); _ = run.Wait() })
	eventually(t, "agent online", func() bool {
		n, ok := c.fleetNode(nodeID)
		return ok && n.Status == api.NodeStatusOnline && len(n.Gpus) == 8
	})

	// A tenant with a key and money.
	tenant := c.env.NewTenant(t, c.admin, "Lifecycle")
	alice := c.env.Client(tenant.AdminToken)
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	sp, _ := ssh.NewPublicKey(pub)
	keyLine := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp)))
	if r, err := alice.CreateSSHKeyWithResponse(ctx, &api.CreateSSHKeyParams{}, api.CreateSSHKeyJSONRequestBody{Name: "laptop", PublicKey: keyLine}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("ssh key: %v %s", err, r.Body)
	}
	if r, err := c.client().CreateBillingAdjustmentWithResponse(ctx, &api.CreateBillingAdjustmentParams{},
		api.BillingAdjustmentRequest{TenantID: tenant.ID, Amount: api.Money{AmountMinor: 1_000_000, Currency: "USD"}, Reason: "e2e credit"}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("credit: %v %s", err, r.Body)
	}

	key := uuid.NewString()
	cr, err := alice.CreateAllocationWithResponse(ctx, &api.CreateAllocationParams{XProjectID: tenant.DefaultProject, IdempotencyKey: &key},
		api.CreateAllocationJSONRequestBody{Name: "train", Sku: e2eSKU})
	if err != nil || cr.StatusCode() != 201 {
		t.Fatalf("create: %v %s", err, cr.Body)
	}
	id := cr.JSON201.ID
	get := func() api.Allocation {
		r, err := alice.GetAllocationWithResponse(ctx, id, &api.GetAllocationParams{XProjectID: tenant.DefaultProject})
		if err != nil || r.JSON200 == nil {
			t.Fatalf("get: %v %s", err, r.Body)
		}
		return *r.JSON200
	}
	eventually(t, "allocation active", func() bool { return get().Status == "active" })
	a := get()
	user := alloctask.UserName(id.String())
	if a.Connection == nil || a.Connection.User != user || a.Connection.Host != "gpu-alloc-1.example" {
		t.Fatalf("connection details %+v, want user %s on gpu-alloc-1.example", a.Connection, user)
	}
	// The agent's workspace: the user's key, and exactly one GPU visible.
	ws := filepath.Join(e.cfg.StateDir, "allocations", id.String())
	keys, err := os.ReadFile(filepath.Join(ws, "authorized_keys"))
	if err != nil || !strings.Contains(string(keys), keyLine) {
		t.Fatalf("authorized_keys: %v %q\n%s", err, keys, logs.String())
	}
	var gpuUUID string
	if err := c.env.Pool.QueryRow(ctx, `SELECT gpu_uuid FROM allocation_gpus WHERE allocation_id = $1 AND released_at IS NULL`, id).Scan(&gpuUUID); err != nil {
		t.Fatal(err)
	}
	envFile, err := os.ReadFile(filepath.Join(ws, "env"))
	if err != nil || !strings.Contains(string(envFile), "export NVIDIA_VISIBLE_DEVICES='"+gpuUUID+"'\n") {
		t.Fatalf("env file does not make exactly %s visible: %v\n%s", gpuUUID, err, envFile)
	}
	var openUsage int
	if err := c.env.Pool.QueryRow(ctx, `SELECT count(*) FROM billing_usage_records WHERE source_id = $1 AND bill_to IS NULL`, id).Scan(&openUsage); err != nil {
		t.Fatal(err)
	}
	if openUsage != 1 {
		t.Fatalf("open usage records while active: %d, want 1", openUsage)
	}
	events := func() []string {
		r, err := alice.ListAllocationEventsWithResponse(ctx, id, &api.ListAllocationEventsParams{XProjectID: tenant.DefaultProject})
		if err != nil || r.JSON200 == nil {
			t.Fatalf("events: %v %s", err, r.Body)
		}
		var out []string
		for _, ev := range r.JSON200.Items {
			out = append(out, string(ev.ToStatus))
		}
		return out
	}
	// The agent's result travels apart from its acknowledgement and can overtake it: the
	// lifecycle then moves requested -> active directly (docs/allocation-lifecycle.md).
	if got := strings.Join(events(), ","); got != "requested,provisioning,active" && got != "requested,active" {
		t.Fatalf("transitions %s, want requested,provisioning,active (or requested,active when the result overtook the acknowledgement)", got)
	}

	// A control-plane restart; the agent comes back to the new one. The provision task
	// delivered again (as a redelivery after a crash would) is a DUPLICATE and runs
	// nothing: no new transition, the workspace untouched.
	var taskID string
	if err := c.env.Pool.QueryRow(ctx, `SELECT task_id::text FROM allocation_tasks WHERE allocation_id = $1 AND kind = 'allocation.provision'`, id).Scan(&taskID); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(filepath.Join(ws, "authorized_keys"))
	if err != nil {
		t.Fatal(err)
	}
	c.restart()
	c.runBackground(c.app)
	eventually(t, "agent back on the restarted control plane", func() bool { return c.app.Fabric.LocalSessions() == 1 })
	// Retried while the node is offline, as the provisioning dispatcher does: an agent's
	// first tunnel after a restart can still be replaced by its next one (seen once in
	// four runs as "node offline" right after LocalSessions reported the tunnel).
	var ack *fabricv1.TaskAck
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ack, err = c.app.Fabric.Dispatch(ctx, nodeID, &fabricv1.TaskDispatch{TaskId: taskID, Kind: alloctask.KindProvision, Payload: []byte(`{}`), Attempt: 2})
		if !errors.Is(err, fabric.ErrNodeOffline) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || ack.GetStatus() != fabricv1.TaskAckStatus_TASK_ACK_STATUS_DUPLICATE {
		t.Fatalf("redelivered provision: %v %v, want DUPLICATE", ack, err)
	}
	after, err := os.Stat(filepath.Join(ws, "authorized_keys"))
	if err != nil || !after.ModTime().Equal(before.ModTime()) {
		t.Fatalf("the redelivered task touched the workspace (%v)", err)
	}
	if got := strings.Join(events(), ","); got != "requested,provisioning,active" {
		t.Fatalf("transitions after redelivery %s", got)
	}

	// Release: releasing → released, the workspace removed, the GPU free, billing closed.
	rr, err := alice.ReleaseAllocationWithResponse(ctx, id, &api.ReleaseAllocationParams{XProjectID: tenant.DefaultProject})
	if err != nil || rr.StatusCode() != 200 {
		t.Fatalf("release: %v %s", err, rr.Body)
	}
	eventually(t, "allocation released", func() bool { return get().Status == "released" })
	if _, err := os.Stat(ws); !os.IsNotExist(err) {
		t.Fatalf("workspace still there after release: %v", err)
	}
	var held int
	if err := c.env.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM allocation_gpus WHERE allocation_id = $1 AND released_at IS NULL),
		(SELECT count(*) FROM billing_usage_records WHERE source_id = $1 AND bill_to IS NULL)`, id).Scan(&held, &openUsage); err != nil {
		t.Fatal(err)
	}
	if held != 0 || openUsage != 0 {
		t.Fatalf("after release: %d GPUs held, %d usage records open", held, openUsage)
	}
	if got := strings.Join(events(), ","); got != "requested,provisioning,active,releasing,released" {
		t.Fatalf("transitions %s", got)
	}
}
