package allocations

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
)

// A hint is a copy that callers may change, lives for its TTL, loses the GPUs this
// replica picked, and stops being offered once no node in it fits the launch.
func TestPlacementHints(t *testing.T) {
	var h placementHints
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	a, b := uuid.New(), uuid.New()
	key := hintKey("H100", []string{"r1"}, 2)
	if _, ok := h.get(key, t0, time.Second); ok {
		t.Fatal("hint before any read")
	}
	h.put(key, t0, 2, []nodes.PlacementNode{
		{NodeID: a, Region: "r1", GPUs: []nodes.PlacementGPU{{UUID: "a0", Index: 0}, {UUID: "a1", Index: 1}}},
		{NodeID: b, Region: "r1", GPUs: []nodes.PlacementGPU{{UUID: "b0", Index: 0}, {UUID: "b1", Index: 1}, {UUID: "b2", Index: 2}}},
	})
	got, ok := h.get(key, t0.Add(999*time.Millisecond), time.Second)
	if !ok || len(got) != 2 {
		t.Fatalf("fresh hint: %v %+v", ok, got)
	}
	got[0].GPUs[0].UUID = "changed" // the caller's copy
	if _, ok := h.get(hintKey("H100", []string{"r1"}, 1), t0, time.Second); ok {
		t.Fatal("a hint for another shape")
	}

	h.take(key, a, []gpuSlot{{UUID: "a0", Index: 0}})
	got, _ = h.get(key, t0, time.Second)
	if fmt.Sprint(got[0].GPUs, got[1].GPUs) != "[{a1 1}] [{b0 0} {b1 1} {b2 2}]" {
		t.Fatalf("after take: %+v", got)
	}
	h.take(key, b, []gpuSlot{{UUID: "b0"}, {UUID: "b2"}})
	if _, ok := h.get(key, t0, time.Second); ok {
		t.Fatal("a hint without a node that fits 2 GPUs")
	}

	h.put(key, t0, 2, []nodes.PlacementNode{{NodeID: a, GPUs: []nodes.PlacementGPU{{UUID: "a0"}, {UUID: "a1"}}}})
	if _, ok := h.get(key, t0.Add(time.Second), time.Second); ok {
		t.Fatal("a hint past its TTL")
	}
	if _, ok := h.get(key, t0.Add(-time.Millisecond), time.Second); ok {
		t.Fatal("a hint read in the future (the clock went back)")
	}
}
