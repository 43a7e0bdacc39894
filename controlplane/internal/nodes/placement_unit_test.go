package nodes

import (
	"fmt"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/nodes/nodesdb"
)

// The query hands a node's GPUs over in no particular order, as two arrays paired by
// position; a candidate lists them by index with each UUID kept beside its index.
func TestPlacementNodeOrdersGPUsByIndex(t *testing.T) {
	id := uuid.New()
	n, err := placementNode(nodesdb.PlacementCandidatesRow{
		NodeID: id, Region: "r1",
		GpuUuids:   []string{"GPU-5", "GPU-0", "GPU-3", "GPU-1"},
		GpuIndexes: []int32{5, 0, 3, 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	if n.NodeID != id || n.Region != "r1" || fmt.Sprint(n.GPUs) != "[{GPU-0 0} {GPU-1 1} {GPU-3 3} {GPU-5 5}]" {
		t.Fatalf("got %+v", n)
	}
	if _, err := placementNode(nodesdb.PlacementCandidatesRow{NodeID: id, GpuUuids: []string{"GPU-0"}}); err == nil {
		t.Fatal("arrays of different lengths accepted")
	}
}
