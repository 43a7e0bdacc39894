package allocations

import (
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
)

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

// freeNode is a candidate node with the GPUs placement still believes free, by index
// (nodes.PlacementCandidates lists them so).
type freeNode struct {
	NodeID uuid.UUID
	Region string
	free   []gpuSlot
}

// freePool is placement's working view of the candidates (nodes.PlacementCandidates:
// best fit first, equal nodes in random order). Policy: pack (best fit) — an allocation
// goes to the node with the fewest free GPUs that still fits it; among equal nodes the
// first in the pool's order, which the database shuffled, so that concurrent launches
// spread over equal nodes instead of all reaching for the same GPU. Packing keeps whole
// nodes free for the larger SKUs and a group's members together where they fit.
type freePool struct {
	nodes []freeNode
}

func newFreePool(cands []nodes.PlacementNode) *freePool {
	p := &freePool{nodes: make([]freeNode, 0, len(cands))}
	for _, c := range cands {
		n := freeNode{NodeID: c.NodeID, Region: c.Region, free: make([]gpuSlot, 0, len(c.GPUs))}
		for _, g := range c.GPUs {
			n.free = append(n.free, gpuSlot{UUID: g.UUID, Index: g.Index})
		}
		p.nodes = append(p.nodes, n)
	}
	return p
}

// best is the index of the node with the fewest free GPUs that still has count, in
// region when region is not "", the first of equal ones; -1 when none fits.
func (p *freePool) best(count int, region string) int {
	best := -1
	for i, n := range p.nodes {
		if len(n.free) < count || (region != "" && n.Region != region) {
			continue
		}
		if best < 0 || len(n.free) < len(p.nodes[best].free) {
			best = i
		}
	}
	return best
}

// pick chooses count free GPUs of node i without taking them: its lowest-index free
// GPUs. (Picking a random free GPU for a single-GPU launch, so that launches that chose
// the same node rarely reach for the same GPU, measured no faster: a claim that loses
// waits only for the winner's commit, then moves on.)
func (p *freePool) pick(i, count int) []gpuSlot {
	return slices.Clone(p.nodes[i].free[:count])
}

// remove drops GPUs of node i from the pool (placed, or found taken).
func (p *freePool) remove(i int, gpus []gpuSlot) {
	p.nodes[i].free = slices.DeleteFunc(p.nodes[i].free, func(g gpuSlot) bool {
		return slices.ContainsFunc(gpus, func(o gpuSlot) bool { return o.UUID == g.UUID })
	})
}

// placeMembers chooses a node and GPUs for each of n allocations of count GPUs, all in
// one region: the first of regions (the catalog's order) that fits them all. The pool
// must be exact (read under the GPU model's exclusive lock, see lockLaunch); since every
// member needs the same count, a node with f free GPUs takes f / count of them in any
// order, so the greedy best fit finds a placement whenever one exists. ok is false when
// none fits.
func placeMembers(cands []nodes.PlacementNode, regions []string, count, n int) ([]placement, bool) {
	for _, r := range regions {
		p := newFreePool(cands)
		out := make([]placement, 0, n)
		for range n {
			i := p.best(count, r)
			if i < 0 {
				break
			}
			gpus := p.pick(i, count)
			p.remove(i, gpus)
			out = append(out, placement{NodeID: p.nodes[i].NodeID, Region: r, GPUs: gpus})
		}
		if len(out) == n {
			return out, true
		}
	}
	return nil, false
}

// byUUID orders GPUs the way every claim inserts them (see ClaimGPUs).
func byUUID(gpus []gpuSlot) []gpuSlot {
	out := slices.Clone(gpus)
	slices.SortFunc(out, func(a, b gpuSlot) int { return strings.Compare(a.UUID, b.UUID) })
	return out
}
