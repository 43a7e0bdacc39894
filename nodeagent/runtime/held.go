package runtime

import (
	"sort"
)

// Held is one allocation the node still holds: a record that is not a tombstone.
type Held struct {
	AllocationID string
	Phase        Phase
}

// Held lists the allocations this node holds (provisioning, active or stopped), by id:
// what the agent's Hello reports for the control plane's reconcile. An allocation whose
// record says released, or that has no record, is gone from this node.
func (r *Runtime) Held() []Held {
	r.mu.RLock()
	out := make([]Held, 0, len(r.records))
	for id, rec := range r.records {
		if rec.Phase != PhaseReleased && rec.Phase != PhaseNone {
			out = append(out, Held{AllocationID: id, Phase: rec.Phase})
		}
	}
	r.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].AllocationID < out[j].AllocationID })
	return out
}
