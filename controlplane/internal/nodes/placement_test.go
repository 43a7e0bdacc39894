package nodes_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
)

// placed creates a node in region with inv, online unless offline.
func (f *fixture) placed(t *testing.T, name, addr string, region *string, inv fleet.Inventory, offline bool) nodes.Node {
	t.Helper()
	ctx := context.Background()
	n, err := f.svc.Create(ctx, nodes.Spec{Name: name, Address: addr, Region: region})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.svc.NodeConnected(ctx, n.ID, inv, t0); err != nil {
		t.Fatal(err)
	}
	if err := f.svc.NodeStatus(ctx, n.ID, !offline, t0); err != nil {
		t.Fatal(err)
	}
	return n
}

// hold reserves GPUs of node for a live allocation, as allocations does (released: a
// reservation that ended, which holds nothing any more).
func (f *fixture) hold(t *testing.T, node uuid.UUID, released bool, gpus ...int) {
	t.Helper()
	ctx := context.Background()
	id := uuid.New()
	if _, err := f.pool.Exec(ctx, `INSERT INTO allocations (id, tenant_id, project_id, owner_user_id, name, sku, gpu_model,
		gpu_count, usage_unit, region_code, node_id, ssh_key_ids, ssh_public_keys, status, created_at, updated_at)
		VALUES ($1, $1, $1, $1, 'held', 'h100.1x', 'NVIDIA H100 80GB HBM3', $2, 'gpu.h100', 'r1', $3, '{}', '{}', 'active', $4, $4)`,
		id, len(gpus), node, t0); err != nil {
		t.Fatal(err)
	}
	for _, g := range gpus {
		var rel any
		if released {
			rel = t0
		}
		if _, err := f.pool.Exec(ctx, `INSERT INTO allocation_gpus (allocation_id, node_id, gpu_uuid, gpu_index, reserved_at, released_at)
			SELECT $1, node_id, gpu_uuid, gpu_index, $3, $4 FROM node_gpus WHERE node_id = $2 AND gpu_index = $5`, id, node, t0, rel, g); err != nil {
			t.Fatal(err)
		}
	}
}

func placementIndexes(n nodes.PlacementNode) []int32 {
	out := make([]int32, 0, len(n.GPUs))
	for _, g := range n.GPUs {
		out = append(out, g.Index)
	}
	return out
}

// PlacementCandidates answers what the fleet view's buckets call free, per node, best
// fit first: online and schedulable nodes of the regions, GPUs of the model that are
// healthy or unsampled and not held by a live allocation.
func TestPlacementCandidates(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	const model = "NVIDIA H100 80GB HBM3"
	r1, r2 := "r1", "r2"
	a := f.placed(t, "a", "10.0.1.1", &r1, dgxH100("a"), false)
	b := f.placed(t, "b", "10.0.1.2", &r1, dgxH100("b"), false)
	f.placed(t, "c", "10.0.1.3", &r1, dgxH100("c"), true) // offline
	d := f.placed(t, "d", "10.0.1.4", &r2, dgxH100("d"), false)
	f.placed(t, "e", "10.0.1.5", nil, dgxH100("e"), false) // in no region
	other := fleet.Inventory{AgentVersion: "1.0.0", Hostname: "g"}
	for i := range 4 {
		other.GPUs = append(other.GPUs, fleet.GPU{Index: i, UUID: fmt.Sprintf("GPU-g-%d", i), Model: "NVIDIA A100-SXM4-80GB",
			MemoryBytes: 80 << 30, PCIBusID: fmt.Sprintf("0000:%02x:00.0", i), DriverVersion: "550.54.15", CUDAVersion: "12.4"})
	}
	g := f.placed(t, "g", "10.0.1.6", &r1, other, false)
	if _, err := f.svc.ChangeSchedule(ctx, b.ID, nodes.ActionCordon); err != nil {
		t.Fatal(err)
	}
	s := samples(dgxH100("a"), t0, 10)
	s[7].Healthy = false
	if err := f.svc.NodeTelemetry(ctx, a.ID, s); err != nil {
		t.Fatal(err)
	}
	f.hold(t, a.ID, false, 0, 1)
	f.hold(t, a.ID, true, 2)
	f.hold(t, d.ID, false, 5)

	got, err := f.svc.PlacementCandidates(ctx, model, []string{r1}, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	// a: 0 and 1 held, 7 unhealthy, 2 released again; b cordoned, c offline, e in no region.
	if len(got) != 1 || got[0].NodeID != a.ID || got[0].Region != r1 || fmt.Sprint(placementIndexes(got[0])) != "[2 3 4 5 6]" ||
		got[0].GPUs[0].UUID != "GPU-a-2" {
		t.Fatalf("r1: %+v", got)
	}
	// Best fit first: a (5 free) before d (7 free).
	got, err = f.svc.PlacementCandidates(ctx, model, []string{r1, r2}, 1, 0)
	if err != nil || len(got) != 2 || got[0].NodeID != a.ID || got[1].NodeID != d.ID || fmt.Sprint(placementIndexes(got[1])) != "[0 1 2 3 4 6 7]" {
		t.Fatalf("r1+r2: %v %+v", err, got)
	}
	// At most max_nodes, the best fits.
	if got, err = f.svc.PlacementCandidates(ctx, model, []string{r1, r2}, 1, 1); err != nil || len(got) != 1 || got[0].NodeID != a.ID {
		t.Fatalf("max 1: %v %+v", err, got)
	}
	// Only nodes with gpu_count free GPUs.
	if got, err = f.svc.PlacementCandidates(ctx, model, []string{r1, r2}, 6, 0); err != nil || len(got) != 1 || got[0].NodeID != d.ID {
		t.Fatalf("6 gpus: %v %+v", err, got)
	}
	if got, err = f.svc.PlacementCandidates(ctx, model, []string{r1, r2}, 8, 0); err != nil || len(got) != 0 {
		t.Fatalf("8 gpus: %v %+v", err, got)
	}
	// Only GPUs of the model.
	if got, err = f.svc.PlacementCandidates(ctx, "NVIDIA A100-SXM4-80GB", []string{r1}, 4, 0); err != nil || len(got) != 1 || got[0].NodeID != g.ID {
		t.Fatalf("a100: %v %+v", err, got)
	}
	if got, err = f.svc.PlacementCandidates(ctx, model, nil, 1, 0); err != nil || len(got) != 0 {
		t.Fatalf("no region: %v %+v", err, got)
	}
}
