package allocations_test

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/proto/api"
)

// Single launches place from a replica's hint of the candidates (250 ms by default; the
// manual clock keeps it fresh here), and the claim turns down what the hint no longer
// knows: a node cordoned, a node gone offline, a GPU found unhealthy since the hint was
// read. The launch then moves to what placement would choose now.
func TestStaleHintNeverPlacesWhatPlacementWouldRefuse(t *testing.T) {
	w, clk := clockWorld(t, 16)
	ctx := context.Background()
	first := w.node(t, "h1", 4)
	second := w.node(t, "h2", 4)
	other := map[string]string{first.String(): second.String(), second.String(): first.String()}
	names := map[uuid.UUID]string{first: "h1", second: "h2"}

	// The first create reads the hint; best fit then prefers its node (3 free) for the
	// next single launch.
	a := w.mustCreate(t, "a")
	used := a.NodeID.String()
	if _, err := w.App.Nodes.ChangeSchedule(ctx, a.NodeID, nodes.ActionCordon); err != nil {
		t.Fatal(err)
	}
	b := w.mustCreate(t, "b")
	if b.NodeID.String() != other[used] {
		t.Fatalf("placed on %s: the cordoned node was %s", b.NodeID, used)
	}
	if _, err := w.App.Nodes.ChangeSchedule(ctx, a.NodeID, nodes.ActionUncordon); err != nil {
		t.Fatal(err)
	}

	// The node b went to goes offline: the next launch goes back to a's node.
	if err := w.App.Nodes.NodeStatus(ctx, b.NodeID, false, clk.Now()); err != nil {
		t.Fatal(err)
	}
	c := w.mustCreate(t, "c")
	if c.NodeID != a.NodeID {
		t.Fatalf("c on %s, want %s (the other node is offline)", c.NodeID, a.NodeID)
	}

	// Every free GPU left on a's node reports unhealthy: the next launch finds none
	// there and none on the offline node.
	var ms []fleet.GPUMetrics
	for i := range 4 {
		ms = append(ms, fleet.GPUMetrics{UUID: gpuUUID(names[a.NodeID], i), Healthy: false, SampledAt: clk.Now()})
	}
	if err := w.App.Nodes.NodeTelemetry(ctx, a.NodeID, ms); err != nil {
		t.Fatal(err)
	}
	before := w.writes(t)
	r, err := w.create(w.Alice, w.Acme.DefaultProject, "", api.CreateAllocationJSONRequestBody{Name: "d", Sku: sku1x})
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, r.Body, r.StatusCode(), 409, "sku_unavailable", "")
	if w.writes(t) != before {
		t.Fatal("a refused launch wrote something")
	}
}
