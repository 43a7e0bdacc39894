package terminal

import (
	"context"
	"encoding/json"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
)

// Allocation status events (published by the outbox relay on
// <events prefix>allocation.<status>) close the terminals of an allocation that stops
// running: every replica listens (plain NATS, no durable consumer: a replica only cares
// about the bridges it holds now), ends its own bridges, and ends the detached sessions
// in the database. Events can arrive late and out of order (the relay publishes a
// backlog in order, long after the fact), so an event only says "look again": the
// allocation's current status decides. The agent ends the PTYs on the node itself when
// it executes the release.

type allocationEvent struct {
	AllocationID uuid.UUID `json:"allocation_id"`
	Status       string    `json:"status"`
}

// mayEndSessions is whether entering status can end an allocation's terminals. Entering
// a running status cannot, nor can entering a status only reached before the first start
// (requested, provisioning, and failed, which only they lead to): a session needs a
// running allocation (docs/allocation-lifecycle.md; a unit test walks its table). Two of
// every create's events are of those, and each would cost a database read.
func mayEndSessions(status string) bool {
	switch status {
	case "requested", "provisioning", "failed":
		return false
	}
	return !running(status)
}

func (s *Service) subscribeAllocationEvents() (*nats.Subscription, error) {
	prefix := s.deps.EventsSubjectPrefix
	if prefix == "" {
		prefix = "gantry.events."
	}
	return s.deps.NATS.Subscribe(prefix+"allocation.>", func(m *nats.Msg) {
		var ev allocationEvent
		if err := json.Unmarshal(m.Data, &ev); err != nil || ev.AllocationID == uuid.Nil || !mayEndSessions(ev.Status) {
			return
		}
		// Off the NATS delivery goroutine: this reads and writes the database.
		go s.AllocationChanged(context.Background(), ev.AllocationID)
	})
}

// AllocationChanged ends the terminals of the allocation when it is no longer running:
// the bridges on this replica (each tells the agent to close and forwards its exit) and
// the sessions nobody is attached to. It changes nothing while the allocation runs.
func (s *Service) AllocationChanged(ctx context.Context, allocationID uuid.UUID) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	live, err := s.q(ctx).LiveSessionsOfAllocation(ctx, allocationID)
	if err != nil {
		s.deps.Log.WarnContext(ctx, "terminal: live sessions of an allocation", "allocation_id", allocationID, "err", err)
		return
	}
	bridges := s.localBridges(allocationID)
	var project uuid.UUID
	switch {
	case len(bridges) > 0:
		project = bridges[0].alloc.ProjectID
	case len(live) > 0:
		project = live[0].ProjectID
	default:
		return // no terminal of it anywhere
	}
	a, err := s.deps.Allocations.Allocation(ctx, project, allocationID)
	if err != nil || running(a.Status) {
		return
	}
	reason := reasonForStatus(a.Status)
	for _, b := range bridges {
		b.stop(cause{kind: causeEnded, reason: reason})
	}
	for _, sess := range live {
		if Status(sess.Status) != StatusDetached {
			continue
		}
		if _, err := s.End(ctx, sess.ID, onlyDetached, reason, nil); err != nil {
			s.deps.Log.WarnContext(ctx, "terminal: ending a detached session", "session_id", sess.ID, "err", err)
		}
	}
}

// reasonForStatus is the end reason of sessions of an allocation in a status that does
// not run.
func reasonForStatus(status string) EndReason {
	if status == "releasing" || status == "released" {
		return EndReleased
	}
	return EndAllocationInactive
}
