package allocations

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/allocationsdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
)

// candidate is a node that could take the SKU: online, schedulable, in an allowed region,
// with its usable GPUs of the SKU's model (healthy or not sampled yet), by index.
type candidate struct {
	NodeID uuid.UUID
	Region string
	GPUs   []nodes.FleetGPU
}

// gpuSlot is one GPU chosen for an allocation.
type gpuSlot struct {
	UUID  string
	Index int32
}

// placement is the node and GPUs chosen for an allocation.
type placement struct {
	NodeID uuid.UUID
	Region string
	GPUs   []gpuSlot
}

// candidates reads the fleet once and keeps the nodes that could take count GPUs of
// model in one of regions, judged by the fleet's own view of what is held (a snapshot;
// placement re-checks under its lock).
func (s *Service) candidates(ctx context.Context, model string, count int, regions []string) ([]candidate, error) {
	view, err := s.Fleet.Fleet(ctx, uuid.Nil, math.MaxInt32)
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	var out []candidate
	for _, n := range view.Nodes {
		if n.Status != nodes.StatusOnline || nodes.ScheduleState(n.ScheduleState) != nodes.Schedulable || n.Region == nil {
			continue
		}
		if !slices.Contains(regions, *n.Region) {
			continue
		}
		c := candidate{NodeID: n.ID, Region: *n.Region}
		free := 0
		for _, g := range n.GPUs {
			if g.Model != model || (g.Healthy.Valid && !g.Healthy.Bool) {
				continue
			}
			c.GPUs = append(c.GPUs, g)
			if !g.Allocated {
				free++
			}
		}
		if free >= count {
			slices.SortFunc(c.GPUs, func(a, b nodes.FleetGPU) int { return int(a.GpuIndex) - int(b.GpuIndex) })
			out = append(out, c)
		}
	}
	return out, nil
}

// place chooses a node and its GPUs among cands, against what live allocations hold now
// (read inside tx, under the GPU model's lock). Policy: pack — the node with the fewest
// free GPUs that still fits the SKU (best fit, ties by node id), its lowest-index free
// GPUs. Packing keeps whole nodes free for the larger SKUs. ok is false when none fits.
func place(ctx context.Context, q *allocationsdb.Queries, cands []candidate, count int) (placement, bool, error) {
	ids := make([]uuid.UUID, 0, len(cands))
	for _, c := range cands {
		ids = append(ids, c.NodeID)
	}
	rows, err := q.HeldGPUsOnNodes(ctx, ids)
	if err != nil {
		return placement{}, false, fmt.Errorf("held gpus: %w", err)
	}
	held := map[uuid.UUID]map[string]bool{}
	for _, r := range rows {
		if held[r.NodeID] == nil {
			held[r.NodeID] = map[string]bool{}
		}
		held[r.NodeID][r.GpuUuid] = true
	}
	var best *placement
	bestFree := 0
	for _, c := range cands {
		var free []gpuSlot
		for _, g := range c.GPUs {
			if !held[c.NodeID][g.GpuUuid] {
				free = append(free, gpuSlot{UUID: g.GpuUuid, Index: g.GpuIndex})
			}
		}
		if len(free) < count {
			continue
		}
		if best == nil || len(free) < bestFree || (len(free) == bestFree && bytes.Compare(c.NodeID[:], best.NodeID[:]) < 0) {
			best, bestFree = &placement{NodeID: c.NodeID, Region: c.Region, GPUs: free[:count]}, len(free)
		}
	}
	if best == nil {
		return placement{}, false, nil
	}
	return *best, true, nil
}
