package allocations

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/allocationsdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/lifecycle"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// GPU ownership (docs/allocation-lifecycle.md, "GPU ownership"): no GPU is given to a
// new allocation until the node has confirmed that the old workload using it is gone.
// An allocation that ends without that confirmation — the report timeout failing a
// provision the agent took, an admin force-release, a workload the node still holds
// after its allocation ended — keeps its GPUs held (allocation_gpus.released_at stays
// NULL, so placement and ClaimGPUs pass them over) with node_cleanup set, and its node
// gets a cleanup task (an allocation.release task marked cleanup). The confirmation is
// either that task succeeding (cleanupReported) or the agent's reconcile on a
// (re)connect reporting the workload absent (Reconcile); it frees the GPUs.

// startCleanup queues a cleanup task for the node of the locked allocation a, in tx (a
// pipeline is fine: nothing is read back); the caller has set a's node_cleanup (SetStatus
// with Cleanup, or SetNodeCleanup).
func (s *Service) startCleanup(ctx context.Context, tx pgx.Tx, a Allocation) error {
	taskID := s.IDs.New()
	if err := allocationsdb.New(tx).InsertCleanupTask(ctx, allocationsdb.InsertCleanupTaskParams{
		TaskID: taskID, AllocationID: a.ID, NodeID: a.NodeID, CreatedAt: s.now(),
	}); err != nil {
		return fmt.Errorf("insert cleanup task: %w", err)
	}
	if _, err := s.Outbox.Enqueue(ctx, tx, outbox.Event{Type: DispatchEventType, Subject: DispatchSubject, Payload: map[string]any{
		"task_id": taskID.String(), "allocation_id": a.ID.String(), "node_id": a.NodeID.String(), "task_kind": TaskRelease,
	}}); err != nil {
		return fmt.Errorf("enqueue cleanup dispatch: %w", err)
	}
	return nil
}

// cleanupPending reports whether a waits for its node to confirm its workload gone.
func cleanupPending(a Allocation) bool {
	return a.NodeCleanup && !lifecycle.HoldsGPUs(lifecycle.Status(a.Status))
}

// confirmGone records, under the allocation's lock, that its node confirmed the
// workload gone: the GPUs are freed for placement and open cleanup tasks finished. It
// does nothing for an allocation that is not waiting for that (live again, or
// confirmed already). It reports whether it freed anything.
func (s *Service) confirmGone(ctx context.Context, id uuid.UUID, why string) (bool, error) {
	var a Allocation
	freed := false
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		var err error
		a, err = allocationsdb.New(tx).LockAllocation(ctx, id)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("lock allocation: %w", err)
		}
		if !cleanupPending(a) {
			return nil
		}
		freed = true
		return allocationsdb.New(tx).CleanupConfirmed(ctx, allocationsdb.CleanupConfirmedParams{AllocationID: id, At: ptr(s.now())})
	})
	if err != nil || !freed {
		return false, err
	}
	s.Log.InfoContext(ctx, "node confirmed the workload gone: GPUs free", "allocation_id", id, "node_id", a.NodeID, "by", why)
	s.settleDrain(ctx, a.NodeID)
	return true, nil
}

// cleanupReported applies the agent's report of a cleanup task: success confirms the
// workload gone; a failure finishes the task and leaves the GPUs held (the next
// reconcile sends another, an admin sees node_cleanup).
func (s *Service) cleanupReported(ctx context.Context, nodeID uuid.UUID, task allocationsdb.AllocationTask, ok bool, reason string) error {
	if ok {
		if _, err := s.confirmGone(ctx, task.AllocationID, "cleanup task "+task.TaskID.String()); err != nil {
			return err
		}
		return s.finishTask(ctx, task.TaskID)
	}
	s.Log.WarnContext(ctx, "node cleanup failed; GPUs stay held", "allocation_id", task.AllocationID, "node_id", nodeID, "task_id", task.TaskID, "reason", reason)
	return s.finishTask(ctx, task.TaskID)
}

// Reconcile compares what a (re)connecting agent holds (its Hello) with the database
// (fabric.Deps.OnHello): a workload the agent holds whose allocation has ended gets a
// cleanup task (GPUs stay held while they are); an allocation waiting for cleanup on
// this node that the agent does not hold — and has no task of running — is confirmed
// gone, its GPUs freed. Results the agent had pending arrive as TaskResults after the
// Welcome and are recorded by TaskResult. Without a workload list (an agent with no
// runtime) absence proves nothing and only the first rule applies.
func (s *Service) Reconcile(ctx context.Context, nodeID uuid.UUID, h *fabricv1.Hello) error {
	if !h.GetWorkloadsReported() && len(h.GetWorkloads()) == 0 {
		// Nothing held is reported and absence proves nothing: no rule applies, and a
		// fleet of such agents reconnecting at once costs the database nothing.
		return nil
	}
	held := map[uuid.UUID]string{}
	heldIDs := make([]uuid.UUID, 0, len(h.GetWorkloads()))
	for _, w := range h.GetWorkloads() {
		id, err := uuid.Parse(w.GetAllocationId())
		if err != nil || w.GetPhase() == "released" {
			continue
		}
		held[id] = w.GetPhase()
		heldIDs = append(heldIDs, id)
	}
	rows, err := s.read(ctx).ReconcileCandidates(ctx, allocationsdb.ReconcileCandidatesParams{HeldIds: heldIDs, NodeID: nodeID})
	if err != nil {
		return fmt.Errorf("reconcile candidates: %w", err)
	}
	running := h.GetActiveTaskIds()
	for _, r := range rows {
		_, holds := held[r.ID]
		final := !lifecycle.HoldsGPUs(lifecycle.Status(r.Status))
		switch {
		case holds && r.NodeID != nodeID:
			s.Log.WarnContext(ctx, "node holds a workload of an allocation placed on another node", "allocation_id", r.ID, "node_id", nodeID, "placed_on", r.NodeID)
		case holds && final && !r.CleanupOpen:
			if err := s.cleanupHeld(ctx, r.ID, nodeID); err != nil {
				return err
			}
		case !holds && final && r.NodeCleanup && h.GetWorkloadsReported() && r.NodeID == nodeID &&
			!slices.ContainsFunc(r.TaskIds, func(t string) bool { return slices.Contains(running, t) }):
			if _, err := s.confirmGone(ctx, r.ID, "reconcile: absent from the node"); err != nil {
				return err
			}
		}
	}
	return nil
}

// cleanupHeld starts the cleanup of an ended allocation whose workload the node still
// holds, under its lock (checked again there).
func (s *Service) cleanupHeld(ctx context.Context, id, nodeID uuid.UUID) error {
	return db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		a, err := allocationsdb.New(tx).LockAllocation(ctx, id)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("lock allocation: %w", err)
		}
		if lifecycle.HoldsGPUs(lifecycle.Status(a.Status)) || a.NodeID != nodeID {
			return nil
		}
		open, err := allocationsdb.New(tx).CleanupOpen(ctx, id)
		if err != nil || open {
			return err
		}
		held, err := holdFreedGPUs(ctx, tx, id)
		if err != nil {
			return err
		}
		s.Log.WarnContext(ctx, "node still holds the workload of an ended allocation: cleanup task sent",
			"allocation_id", id, "node_id", nodeID, "status", a.Status, "gpus_held_again", held)
		if err := allocationsdb.New(tx).SetNodeCleanup(ctx, id); err != nil {
			return fmt.Errorf("flag node cleanup: %w", err)
		}
		return s.startCleanup(ctx, tx, a)
	})
}

// holdFreedGPUs takes back, for an ended allocation whose workload is still on its node,
// the GPUs nobody claimed since they were freed, so placement passes them over until the
// cleanup is confirmed. A launch claiming one of them at this moment wins (the unique
// index raises a conflict here): then none is taken back.
func holdFreedGPUs(ctx context.Context, tx pgx.Tx, id uuid.UUID) (int64, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("savepoint: %w", err)
	}
	n, err := allocationsdb.New(sp).HoldFreedGPUs(ctx, id)
	if db.IsUniqueViolation(err, "allocation_gpus_held_key") {
		return 0, sp.Rollback(ctx)
	}
	if err != nil {
		_ = sp.Rollback(ctx)
		return 0, fmt.Errorf("hold freed gpus: %w", err)
	}
	return n, sp.Commit(ctx)
}
