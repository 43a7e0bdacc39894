package nodes

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/nodes/nodesdb"
)

// PlacementNode is a node that can take an allocation now, with its free GPUs of the
// asked model by index (free: healthy or not sampled yet, and held by no live
// allocation).
type PlacementNode struct {
	NodeID uuid.UUID
	Region string
	GPUs   []PlacementGPU
}

// PlacementGPU is one free GPU of a PlacementNode.
type PlacementGPU struct {
	UUID  string
	Index int32
}

// PlacementCandidates answers, in one indexed query, the nodes that are online and
// schedulable in one of regions and have at least gpuCount free GPUs of model: best fit
// first (the fewest free GPUs), equal nodes in random order, at most maxNodes of them
// (<= 0: all). It is what placement reads for every launch, so unlike the fleet view it
// reads only the nodes and GPUs that matter and decides "free" in the database, against
// the held rows of allocation_gpus (the one place node administration reads the
// allocations' table: the fleet view learns the same through GPUAllocations, but that
// costs a read of every held GPU per launch). It runs in the transaction of ctx, if any:
// a snapshot that the caller's reservation (the unique index allocation_gpus_held_key)
// confirms.
func (s *Service) PlacementCandidates(ctx context.Context, model string, regions []string, gpuCount, maxNodes int) ([]PlacementNode, error) {
	if len(regions) == 0 || gpuCount < 1 {
		return nil, nil
	}
	if maxNodes <= 0 || maxNodes > math.MaxInt32 {
		maxNodes = math.MaxInt32
	}
	rows, err := s.read(ctx).PlacementCandidates(ctx, nodesdb.PlacementCandidatesParams{
		Regions: regions, Model: model, GpuCount: int32(min(gpuCount, math.MaxInt32)), MaxNodes: int32(maxNodes),
	})
	if err != nil {
		return nil, fmt.Errorf("placement candidates: %w", err)
	}
	out := make([]PlacementNode, 0, len(rows))
	for _, r := range rows {
		n, err := placementNode(r)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// placementNode is one candidate row with its GPUs by index, as the node numbers them
// (the query leaves the order of its arrays open).
func placementNode(r nodesdb.PlacementCandidatesRow) (PlacementNode, error) {
	if len(r.GpuUuids) != len(r.GpuIndexes) {
		return PlacementNode{}, fmt.Errorf("placement candidates: node %s: %d uuids for %d indexes", r.NodeID, len(r.GpuUuids), len(r.GpuIndexes))
	}
	n := PlacementNode{NodeID: r.NodeID, Region: r.Region, GPUs: make([]PlacementGPU, len(r.GpuUuids))}
	for i, u := range r.GpuUuids {
		n.GPUs[i] = PlacementGPU{UUID: u, Index: r.GpuIndexes[i]}
	}
	slices.SortFunc(n.GPUs, func(a, b PlacementGPU) int {
		return cmp.Or(cmp.Compare(a.Index, b.Index), strings.Compare(a.UUID, b.UUID))
	})
	return n, nil
}
