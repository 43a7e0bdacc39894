package allocations

import (
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
)

// DefaultPlacementHintTTL is how long a replica reuses one read of the placement
// candidates for single launches (Config.PlacementHintTTL).
const DefaultPlacementHintTTL = 250 * time.Millisecond

// placementHints keeps, per single-launch shape (GPU model, regions, GPU count), the
// last placement candidates read from the database, for Config.PlacementHintTTL. The
// candidates query reads every GPU of the model in the fleet (2 ms of PostgreSQL's CPU
// on 2,000 GPUs, a third of a create's share), and concurrent launches read the same
// answer anyway. A hint is never trusted: the claim itself (ClaimGPUs) checks that the
// node is online and schedulable and the GPU healthy, of the model and held by nobody,
// so a stale hint costs a claim that comes back empty and a move to the next candidate,
// then a read from the database once the hint is used up. GPUs this replica picks are
// taken out of the hint at once, so its concurrent launches reach for different GPUs.
// Groups never use hints: they place on an exact read under the model's exclusive lock.
type placementHints struct {
	mu      sync.Mutex
	entries map[string]*placementHint
}

type placementHint struct {
	readAt time.Time
	count  int // GPUs per launch of this shape
	nodes  []nodes.PlacementNode
}

func hintKey(model string, regions []string, count int) string {
	return model + "\x00" + strings.Join(regions, "\x00") + "\x00" + strconv.Itoa(count)
}

// get returns a copy of the hint for key when it is younger than ttl and still has a
// node that fits.
func (h *placementHints) get(key string, now time.Time, ttl time.Duration) ([]nodes.PlacementNode, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.entries[key]
	if e == nil || now.Sub(e.readAt) >= ttl || now.Before(e.readAt) ||
		!slices.ContainsFunc(e.nodes, func(n nodes.PlacementNode) bool { return len(n.GPUs) >= e.count }) {
		return nil, false
	}
	return cloneCandidates(e.nodes), true
}

// put stores a fresh read (a copy of it).
func (h *placementHints) put(key string, now time.Time, count int, cands []nodes.PlacementNode) {
	cp := cloneCandidates(cands)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.entries == nil {
		h.entries = map[string]*placementHint{}
	}
	h.entries[key] = &placementHint{readAt: now, count: count, nodes: cp}
}

// cloneCandidates copies candidates with their GPU lists, so that a launch's picks and
// the hint's own edits never reach each other.
func cloneCandidates(cands []nodes.PlacementNode) []nodes.PlacementNode {
	out := make([]nodes.PlacementNode, len(cands))
	for i, n := range cands {
		out[i] = n
		out[i].GPUs = slices.Clone(n.GPUs)
	}
	return out
}

// take removes GPUs of node from the hint for key (picked by a launch of this replica;
// if that launch does not commit, the next read brings them back).
func (h *placementHints) take(key string, node uuid.UUID, gpus []gpuSlot) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.entries[key]
	if e == nil {
		return
	}
	for i := range e.nodes {
		if e.nodes[i].NodeID != node {
			continue
		}
		e.nodes[i].GPUs = slices.DeleteFunc(e.nodes[i].GPUs, func(g nodes.PlacementGPU) bool {
			return slices.ContainsFunc(gpus, func(o gpuSlot) bool { return o.UUID == g.UUID })
		})
	}
}
