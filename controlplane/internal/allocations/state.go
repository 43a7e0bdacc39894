package allocations

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/allocationsdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/lifecycle"
	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
	"github.com/gantry-gpu/gantry/shared/alloctask"
	"github.com/gantry-gpu/gantry/shared/correlation"
)

// Actor types of status events.
const (
	ActorUser   = "user"
	ActorAdmin  = "admin"
	ActorNode   = "node"
	ActorSystem = "system"
)

// Actor is who caused a transition.
type Actor struct {
	Type string
	ID   string // user id, node id; "" for the system
}

func ptr[T any](v T) *T { return &v }

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// transition applies event to the locked allocation a inside tx: the lifecycle decides
// the move; a repeat writes nothing; a change writes the new status, frees the GPUs when
// the new status does not hold them (unless the node must confirm the workload gone
// first: transitionCleanup), and records the status event, the outbox event
// (allocation.<new status>) and the audit row (allocation.<event>).
func (s *Service) transition(ctx context.Context, tx pgx.Tx, a Allocation, ev lifecycle.Event, actor Actor, reason string) (Allocation, lifecycle.Outcome, error) {
	return s.transitionCleanup(ctx, tx, a, ev, actor, reason, false)
}

// transitionCleanup is transition where the caller knows that nothing confirmed the
// node clean (cleanup), as force_release's outcome says too (CleanupNode): a move to a
// status that does not hold GPUs then keeps them held and sends the node a cleanup task
// instead of freeing them (GPU ownership, cleanup.go).
func (s *Service) transitionCleanup(ctx context.Context, tx pgx.Tx, a Allocation, ev lifecycle.Event, actor Actor, reason string, cleanup bool) (Allocation, lifecycle.Outcome, error) {
	out, err := lifecycle.Apply(lifecycle.Status(a.Status), ev)
	if err != nil || !out.Changed {
		return a, out, err
	}
	cleanup = cleanup || out.CleanupNode
	now := s.now()
	a, err = allocationsdb.New(tx).SetStatus(ctx, allocationsdb.SetStatusParams{
		ID: a.ID, Status: string(out.To), StatusReason: optional(reason), UpdatedAt: now, Cleanup: cleanup,
	})
	if err != nil {
		return a, out, fmt.Errorf("set allocation status: %w", err)
	}
	// Metering runs on the transaction itself (billing reads what it writes, and counts
	// rows), after anything a pipeline holds.
	if lifecycle.UsageOnEntry(out.To) != lifecycle.UsageKeep {
		plain, err := unpipelined(ctx, tx)
		if err != nil {
			return a, out, err
		}
		if err := s.meter(ctx, plain, a, out.To, now); err != nil {
			return a, out, err
		}
	}
	if s.Ended != nil && lifecycle.IsFinal(out.To) {
		plain, err := unpipelined(ctx, tx)
		if err != nil {
			return a, out, err
		}
		if err := s.Ended(ctx, plain, a.ID); err != nil {
			return a, out, fmt.Errorf("allocation ended: %w", err)
		}
	}
	if s.Attachments != nil && out.To == lifecycle.Active {
		plain, err := unpipelined(ctx, tx)
		if err != nil {
			return a, out, err
		}
		if err := s.Attachments.Active(ctx, plain, a.ID); err != nil {
			return a, out, fmt.Errorf("allocation active: %w", err)
		}
	}
	// What follows writes rows nothing in this transaction reads back: one round trip.
	p, own := pipeline(tx)
	switch {
	case lifecycle.HoldsGPUs(out.To):
	case cleanup:
		if err := s.startCleanup(ctx, p, a); err != nil {
			return a, out, err
		}
	default:
		if err := allocationsdb.New(p).FreeGPUs(ctx, allocationsdb.FreeGPUsParams{AllocationID: a.ID, ReleasedAt: &now}); err != nil {
			return a, out, fmt.Errorf("free gpus: %w", err)
		}
	}
	if err := s.record(ctx, p, a, ptr(string(out.From)), string(ev), "allocation."+string(ev), actor, reason); err != nil {
		return a, out, err
	}
	if own {
		if err := p.flush(ctx); err != nil {
			return a, out, fmt.Errorf("record allocation %s: %w", ev, err)
		}
	}
	return a, out, nil
}

// recorded writes the status event, the outbox event and the audit row of a's current
// status (a transition from `from`, nil on creation), in one round trip: they are
// pipelined, and flushed here unless tx is a pipeline already (its owner flushes it).
func (s *Service) recorded(ctx context.Context, tx pgx.Tx, a Allocation, from *string, event, auditAction string, actor Actor, reason string) error {
	p, own := pipeline(tx)
	if err := s.record(ctx, p, a, from, event, auditAction, actor, reason); err != nil {
		return err
	}
	if !own {
		return nil
	}
	if err := p.flush(ctx); err != nil {
		return fmt.Errorf("record allocation %s: %w", a.Status, err)
	}
	return nil
}

// record queues recorded's writes on p.
func (s *Service) record(ctx context.Context, tx *pipelined, a Allocation, from *string, event, auditAction string, actor Actor, reason string) error {
	if err := allocationsdb.New(tx).InsertEvent(ctx, allocationsdb.InsertEventParams{
		ID: s.IDs.New(), AllocationID: a.ID, FromStatus: from, ToStatus: a.Status, Event: event,
		Reason: optional(reason), ActorType: actor.Type, ActorID: optional(actor.ID),
		CorrelationID: optional(correlation.ID(ctx)), CreatedAt: a.UpdatedAt,
	}); err != nil {
		return fmt.Errorf("insert allocation event: %w", err)
	}
	typ := "allocation." + a.Status
	payload := map[string]any{
		"allocation_id": a.ID.String(), "tenant_id": a.TenantID.String(), "project_id": a.ProjectID.String(),
		"node_id": a.NodeID.String(), "sku": a.Sku, "status": a.Status, "event": event,
	}
	// Entering requested, releasing, stopped or restarting sends the agent a task: its id travels with the
	// event, for the provisioning dispatcher.
	if kind := taskKind(lifecycle.Status(a.Status)); kind != "" {
		taskID := s.IDs.New()
		if err := allocationsdb.New(tx).InsertTask(ctx, allocationsdb.InsertTaskParams{
			TaskID: taskID, AllocationID: a.ID, NodeID: a.NodeID, Kind: kind, CreatedAt: a.UpdatedAt,
		}); err != nil {
			return fmt.Errorf("insert allocation task: %w", err)
		}
		payload["task_id"], payload["task_kind"] = taskID.String(), kind
		if _, err := s.Outbox.Enqueue(ctx, tx, outbox.Event{Type: DispatchEventType, Subject: DispatchSubject, Payload: map[string]any{
			"task_id": taskID.String(), "allocation_id": a.ID.String(), "node_id": a.NodeID.String(), "task_kind": kind,
		}}); err != nil {
			return fmt.Errorf("enqueue task dispatch: %w", err)
		}
	}
	if from != nil {
		payload["from_status"] = *from
	}
	if _, err := s.Outbox.Enqueue(ctx, tx, outbox.Event{Type: typ, Subject: "gantry.events." + typ, Payload: payload}); err != nil {
		return fmt.Errorf("enqueue %s: %w", typ, err)
	}
	meta := map[string]any{"status": a.Status, "sku": a.Sku, "node_id": a.NodeID.String()}
	if from != nil {
		meta["from_status"] = *from
	}
	if reason != "" {
		meta["reason"] = reason
	}
	e := audit.Entry{
		Action: auditAction, TargetType: "allocation", TargetID: a.ID.String(),
		TenantID: a.TenantID, ProjectID: a.ProjectID, Metadata: meta,
	}
	if actor.Type == ActorNode || actor.Type == ActorSystem {
		e.ActorType = actor.Type
	}
	return s.Audit.Record(ctx, tx, e)
}

// Task kinds sent to node agents (shared/alloctask).
const (
	TaskProvision = alloctask.KindProvision
	TaskRelease   = alloctask.KindRelease
	TaskStop      = alloctask.KindStop
	TaskRestart   = alloctask.KindRestart
)

// taskKind is the task that entering status sends to the node's agent, if any.
func taskKind(status lifecycle.Status) string {
	switch status {
	case lifecycle.Requested:
		return TaskProvision
	case lifecycle.Releasing:
		return TaskRelease
	case lifecycle.Stopped:
		return TaskStop
	case lifecycle.Restarting:
		return TaskRestart
	}
	return ""
}

// Provisioning dispatch: every task also goes out as a message on the PROVISIONING
// stream (through the outbox, in the transaction that created it); the dispatcher
// (internal/provisioning) consumes it and delivers the task to the node's agent.
const (
	// DispatchEventType is the outbox event type of a task to dispatch.
	DispatchEventType = "provisioning.dispatch"
	// DispatchSubject is the stored subject; the relay maps "gantry.provisioning." onto
	// the configured provisioning prefix.
	DispatchSubject = "gantry.provisioning.dispatch"
)

// DispatchMessage is the payload of a dispatch message: identifiers only; the dispatcher
// reads the task's input from the database when it delivers it.
type DispatchMessage struct {
	TaskID       string `json:"task_id"`
	AllocationID string `json:"allocation_id"`
	NodeID       string `json:"node_id"`
	Kind         string `json:"task_kind"`
}

// meter applies the billing effect of entering status (lifecycle.UsageOnEntry): a usage
// record opens on active (one per run; StartUsage is idempotent on an open one) and
// closes on stopped, release_failed and the final statuses. Both run in tx.
func (s *Service) meter(ctx context.Context, tx pgx.Tx, a Allocation, status lifecycle.Status, at time.Time) error {
	switch lifecycle.UsageOnEntry(status) {
	case lifecycle.UsageOpen:
		currency := ""
		if a.Currency != nil {
			currency = *a.Currency
		}
		if _, err := s.Billing.StartUsage(ctx, tx, billing.UsageStart{
			Source: billing.SourceAllocation, SourceID: a.ID, TenantID: a.TenantID, ProjectID: a.ProjectID,
			UserID: a.OwnerUserID, Unit: a.UsageUnit, Quantity: int64(a.GpuCount), Currency: currency, StartedAt: at,
		}); err != nil {
			return fmt.Errorf("start usage: %w", err)
		}
	case lifecycle.UsageClose:
		if _, err := s.Billing.StopUsage(ctx, tx, billing.SourceAllocation, a.ID, at); err != nil {
			return fmt.Errorf("stop usage: %w", err)
		}
	}
	return nil
}
