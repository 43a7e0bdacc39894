package nodes

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes/nodesdb"
)

// FleetView is the fleet telemetry read model: one page of nodes with their GPUs and
// latest metrics, and totals by GPU model over the whole fleet.
type FleetView struct {
	GeneratedAt time.Time
	Nodes       []FleetNode
	More        bool
	Totals      []ModelTotals
}

// FleetNode is one node of the fleet view.
type FleetNode struct {
	nodesdb.Node
	// LastHeartbeat is the fabric's live presence when it has one, else the persisted
	// last_seen_at.
	LastHeartbeat *time.Time
	Transport     string
	GPUs          []FleetGPU
}

// FleetGPU is one GPU with its latest sample and whether an allocation holds it.
type FleetGPU struct {
	nodesdb.NodeGpu
	Allocated bool
}

// GPU buckets: every GPU is in exactly one, in this order of precedence.
const (
	bucketAllocated   = "allocated"   // held by a live allocation
	bucketUnhealthy   = "unhealthy"   // latest sample says unhealthy (and not allocated)
	bucketFree        = "free"        // healthy or not yet sampled, on an online schedulable node
	bucketUnavailable = "unavailable" // on an offline, pending, cordoned, draining or drained node
)

// ModelTotals counts the GPUs of one model by bucket; Total is their sum.
type ModelTotals struct {
	Model                                          string
	Total, Allocated, Free, Unhealthy, Unavailable int
}

func bucket(n nodesdb.Node, g nodesdb.NodeGpu, allocated bool) string {
	switch {
	case allocated:
		return bucketAllocated
	case g.Healthy.Valid && !g.Healthy.Bool:
		return bucketUnhealthy
	case n.Status == StatusOnline && ScheduleState(n.ScheduleState) == Schedulable:
		return bucketFree
	}
	return bucketUnavailable
}

// Fleet builds the fleet view: totals over every node, details for the page of nodes
// after after (by id).
func (s *Service) Fleet(ctx context.Context, after uuid.UUID, limit int) (FleetView, error) {
	q := s.read(ctx)
	nodes, err := q.AllNodesByID(ctx)
	if err != nil {
		return FleetView{}, fmt.Errorf("fleet nodes: %w", err)
	}
	gpus, err := q.AllGPUs(ctx)
	if err != nil {
		return FleetView{}, fmt.Errorf("fleet gpus: %w", err)
	}
	held, err := s.Allocations.AllocatedGPUs(ctx)
	if err != nil {
		return FleetView{}, fmt.Errorf("allocated gpus: %w", err)
	}
	allocated := map[uuid.UUID]map[string]bool{}
	for node, uuids := range held {
		m := make(map[string]bool, len(uuids))
		for _, u := range uuids {
			m[u] = true
		}
		allocated[node] = m
	}
	var presence map[uuid.UUID]fleet.Presence
	if s.Presence != nil {
		if presence, err = s.Presence.AllPresence(ctx); err != nil {
			// Live heartbeats are a nicety here; the persisted view still answers.
			s.Log.WarnContext(ctx, "fleet presence unavailable", "err", err)
			presence = nil
		}
	}

	byNode := map[uuid.UUID][]nodesdb.NodeGpu{}
	for _, g := range gpus {
		byNode[g.NodeID] = append(byNode[g.NodeID], g)
	}
	totals := map[string]*ModelTotals{}
	view := FleetView{GeneratedAt: s.now(), Nodes: []FleetNode{}}
	for _, n := range nodes {
		inPage := (after == uuid.Nil || bytesLess(after, n.ID)) && len(view.Nodes) <= limit
		fn := FleetNode{Node: n, GPUs: []FleetGPU{}, LastHeartbeat: n.LastSeenAt}
		if p, ok := presence[n.ID]; ok && !p.LastHeartbeat.IsZero() {
			fn.LastHeartbeat, fn.Transport = ptr(p.LastHeartbeat.UTC()), p.Transport
		}
		for _, g := range byNode[n.ID] {
			held := allocated[n.ID][g.GpuUuid]
			t := totals[g.Model]
			if t == nil {
				t = &ModelTotals{Model: g.Model}
				totals[g.Model] = t
			}
			t.Total++
			switch bucket(n, g, held) {
			case bucketAllocated:
				t.Allocated++
			case bucketUnhealthy:
				t.Unhealthy++
			case bucketFree:
				t.Free++
			default:
				t.Unavailable++
			}
			if inPage {
				fn.GPUs = append(fn.GPUs, FleetGPU{NodeGpu: g, Allocated: held})
			}
		}
		if inPage {
			view.Nodes = append(view.Nodes, fn)
		}
	}
	if len(view.Nodes) > limit {
		view.Nodes, view.More = view.Nodes[:limit], true
	}
	view.Totals = make([]ModelTotals, 0, len(totals))
	for _, t := range totals {
		view.Totals = append(view.Totals, *t)
	}
	slices.SortFunc(view.Totals, func(a, b ModelTotals) int {
		switch {
		case a.Model < b.Model:
			return -1
		case a.Model > b.Model:
			return 1
		}
		return 0
	})
	return view, nil
}

func bytesLess(a, b uuid.UUID) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}
