package allocations

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/allocationsdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/lifecycle"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
	"github.com/gantry-gpu/gantry/shared/alloctask"
)

// What the provisioning dispatcher (internal/provisioning) asks of allocations: the task
// to deliver with its input, and what the delivery came to. The dispatcher owns the
// transport (JetStream, fabric, backoff); allocations owns every decision about the
// allocation, through the same transition as every other change (status event, outbox
// event, audit row in one transaction).

// Event types the dispatcher's failures emit (seed §6.2), beside allocation.<status>.
const (
	// ProvisioningFailedEvent: a provision task failed before the agent ran it (the node
	// never acknowledged it within the provisioning timeout, or refused it).
	ProvisioningFailedEvent = "provisioning.failed"
	// ReleaseFailedEvent: a release task failed before the agent ran it.
	ReleaseFailedEvent = "provisioning.release_failed"
)

// Reason codes of the dispatcher's failures: the first word of the status reason.
const (
	ReasonProvisioningTimeout = "provisioning_timeout"
	ReasonReleaseTimeout      = "release_timeout"
	ReasonRestartTimeout      = "restart_timeout"
	ReasonStopTimeout         = "stop_timeout"
)

// DispatchTask is a task as the dispatcher delivers it.
type DispatchTask struct {
	TaskID       uuid.UUID
	AllocationID uuid.UUID
	NodeID       uuid.UUID
	Kind         string
	CreatedAt    time.Time
	// Deadline is CreatedAt + Config.ProvisioningTimeout: the agent must not start the
	// task after it, and a task not acknowledged by then fails (TaskExpired).
	Deadline time.Time
	Attempts int
	// AllocationStatus is the allocation's status when the task was read.
	AllocationStatus string
	// Settled says why the task needs no delivery any more ("" while it does):
	// "finished", "acknowledged", "allocation_<status>" (the allocation left the status
	// the task was sent for) or "superseded" (a newer task of the allocation replaced it).
	Settled string
	// Payload is the task's input (set while the task is pending).
	Payload alloctask.Payload
}

// Pending reports whether the task still has to reach the agent.
func (t DispatchTask) Pending() bool { return t.Settled == "" }

// taskStatus is the status whose entry sends a task of kind (the inverse of taskKind):
// while the allocation is in it, the task is wanted.
func taskStatus(kind string) lifecycle.Status {
	switch kind {
	case TaskProvision:
		return lifecycle.Requested
	case TaskRelease:
		return lifecycle.Releasing
	case TaskStop:
		return lifecycle.Stopped
	case TaskRestart:
		return lifecycle.Restarting
	}
	return ""
}

// settled is DispatchTask.Settled of a task row.
func settled(t allocationsdb.GetTaskForDispatchRow) string {
	return settledOf(t.Kind, t.Cleanup, t.AckedAt, t.FinishedAt, t.AllocationStatus, t.Superseded)
}

// settledOf is settled from the fields both task reads have. A cleanup task (cleanup.go)
// is wanted whatever the allocation's status: it was sent because the allocation ended
// without its node confirming the workload gone.
func settledOf(kind string, cleanup bool, ackedAt, finishedAt *time.Time, allocationStatus string, superseded bool) string {
	switch {
	case finishedAt != nil:
		return "finished"
	case ackedAt != nil:
		return "acknowledged"
	case !cleanup && allocationStatus != string(taskStatus(kind)):
		return "allocation_" + allocationStatus
	case superseded:
		return "superseded"
	}
	return ""
}

func (s *Service) deadline(createdAt time.Time) time.Time {
	return createdAt.Add(s.Config.ProvisioningTimeout)
}

// DispatchTask loads the task for delivery: ErrUnknownTask when there is no such task.
// A settled task comes without its payload. One read: the task, its allocation and the
// allocation's GPUs.
func (s *Service) DispatchTask(ctx context.Context, taskID uuid.UUID) (DispatchTask, error) {
	row, err := s.read(ctx).GetTaskWithPayload(ctx, taskID)
	if errors.Is(err, pgx.ErrNoRows) {
		return DispatchTask{}, fmt.Errorf("%w: %s", ErrUnknownTask, taskID)
	}
	if err != nil {
		return DispatchTask{}, fmt.Errorf("load task: %w", err)
	}
	t := DispatchTask{
		TaskID: row.TaskID, AllocationID: row.AllocationID, NodeID: row.NodeID, Kind: row.Kind,
		CreatedAt: row.CreatedAt, Deadline: s.deadline(row.CreatedAt), Attempts: int(row.Attempts),
		AllocationStatus: row.AllocationStatus,
		Settled:          settledOf(row.Kind, row.Cleanup, row.AckedAt, row.FinishedAt, row.AllocationStatus, row.Superseded),
	}
	if !t.Pending() {
		return t, nil
	}
	if len(row.GpuUuids) != len(row.GpuIndexes) {
		return DispatchTask{}, fmt.Errorf("load task: %d gpu uuids for %d indexes", len(row.GpuUuids), len(row.GpuIndexes))
	}
	id := row.AllocationID.String()
	p := alloctask.Payload{
		AllocationID: id, TenantID: row.TenantID.String(), ProjectID: row.ProjectID.String(),
		User: alloctask.UserName(id), GPUs: make([]alloctask.GPU, 0, len(row.GpuUuids)),
		SSHPublicKeys: row.SshPublicKeys,
	}
	if p.SSHPublicKeys == nil {
		p.SSHPublicKeys = []string{}
	}
	for i, u := range row.GpuUuids {
		p.GPUs = append(p.GPUs, alloctask.GPU{UUID: u, Index: int(row.GpuIndexes[i])})
	}
	if row.OsImageID.Valid && s.Catalog != nil {
		// The image's name is informational for the runtimes there are; an image deleted
		// since launch leaves it out rather than holding the task back.
		if im, err := s.Catalog.GetOSImage(ctx, row.OsImageID.UUID); err == nil {
			p.OSImage = im.Name
		}
	}
	t.Payload = p
	return t, nil
}

// TaskAcknowledged records that the node's agent took the task (ACCEPTED, or DUPLICATE:
// it had taken it before) at attempt; a provision task moves its allocation requested →
// provisioning (provision_started, actor system), in the same transaction. It reports
// whether this acknowledgement was new; a repeat writes nothing. An acknowledgement that
// arrives after the allocation moved on (the agent's report overtook it, a user released
// it) is recorded on the task and moves nothing.
func (s *Service) TaskAcknowledged(ctx context.Context, taskID uuid.UUID, attempt int) (bool, error) {
	recorded := false
	_, err := s.onTask(ctx, taskID, func(tx pgx.Tx, a Allocation, t allocationsdb.GetTaskForDispatchRow) (lifecycle.Outcome, error) {
		// t was read under the allocation's lock, under which every acknowledgement is
		// written: an acknowledged task stays so, an unacknowledged one cannot be
		// acknowledged meanwhile.
		if t.AckedAt != nil {
			return lifecycle.Outcome{}, nil
		}
		// The acknowledgement goes out with the transition's first statement.
		p, _ := pipeline(tx)
		if err := allocationsdb.New(p).MarkTaskAcked(ctx, allocationsdb.MarkTaskAckedParams{
			TaskID: taskID, AckedAt: ptr(s.now()), Attempts: int32(attempt),
		}); err != nil {
			return lifecycle.Outcome{}, err
		}
		recorded = true
		var out lifecycle.Outcome
		if settled(t) == "" && t.Kind == TaskProvision {
			var err error
			if _, out, err = s.transition(ctx, p, a, lifecycle.ProvisionStarted, Actor{Type: ActorSystem}, "node acknowledged the task"); err != nil {
				return out, err
			}
		}
		if err := p.flush(ctx); err != nil {
			return out, fmt.Errorf("record task acknowledgement: %w", err)
		}
		return out, nil
	})
	return recorded, err
}

// TaskUndelivered records a delivery attempt that did not reach the agent (node
// offline, no acknowledgement in time): the attempt count and the cause, for operators.
func (s *Service) TaskUndelivered(ctx context.Context, taskID uuid.UUID, attempt int, cause string) error {
	return allocationsdb.New(db.Querier(ctx, s.Pool)).RecordTaskAttempt(ctx, allocationsdb.RecordTaskAttemptParams{
		TaskID: taskID, Attempts: int32(attempt), LastError: ptr(truncate(cause, maxReason)),
	})
}

// TaskRejected applies the agent's refusal of a pending task like a failure it reported:
// provision → failed (GPUs freed; provisioning.failed), release → release_failed
// (provisioning.release_failed), restart → restart_failed; a stop task only records it.
// The reason is the agent's code and message. It reports whether anything was written
// (false: the task was settled meanwhile).
func (s *Service) TaskRejected(ctx context.Context, taskID uuid.UUID, attempt int, code, message string) (bool, error) {
	reason := truncate(fmt.Sprintf("%s: %s", code, message), maxReason)
	return s.giveUp(ctx, taskID, attempt, code, reason)
}

// TaskExpired fails a task that no agent acknowledged before its deadline: provision →
// failed ("provisioning_timeout: ...", GPUs freed; provisioning.failed), release →
// release_failed (provisioning.release_failed), restart → restart_failed; a stop task
// only records it. It reports whether anything was written (false: the task was
// acknowledged or settled meanwhile).
func (s *Service) TaskExpired(ctx context.Context, taskID uuid.UUID, attempt int) (bool, error) {
	t, err := s.read(ctx).GetTaskForDispatch(ctx, taskID)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("%w: %s", ErrUnknownTask, taskID)
	}
	if err != nil {
		return false, fmt.Errorf("load task: %w", err)
	}
	code := map[string]string{
		TaskProvision: ReasonProvisioningTimeout, TaskRelease: ReasonReleaseTimeout,
		TaskRestart: ReasonRestartTimeout, TaskStop: ReasonStopTimeout,
	}[t.Kind]
	reason := fmt.Sprintf("%s: node did not acknowledge within %s", code, humanDuration(s.Config.ProvisioningTimeout))
	return s.giveUp(ctx, taskID, attempt, code, reason)
}

// giveUp ends a pending task that will not reach the agent: the failure event of its
// kind, the task finished with the reason, and the provisioning.* event, in one
// transaction.
func (s *Service) giveUp(ctx context.Context, taskID uuid.UUID, attempt int, code, reason string) (bool, error) {
	done := false
	_, err := s.onTask(ctx, taskID, func(tx pgx.Tx, a Allocation, t allocationsdb.GetTaskForDispatchRow) (lifecycle.Outcome, error) {
		if settled(t) != "" {
			return lifecycle.Outcome{}, nil
		}
		done = true
		return s.failTask(ctx, tx, a, t, attempt, code, reason, true, false)
	})
	return done, err
}

// failTask finishes task t of the locked allocation a with reason and, when move is
// set, applies the failure event of its kind with its provisioning.* event; t must be
// unfinished. cleanup keeps the GPUs held after the move and sends the node a cleanup
// task (the node may still run the workload: GPU ownership, cleanup.go). A stop task
// never moves anything: the allocation is stopped and billing closed already; the
// node's processes are the agent's to stop when it returns. Neither does a cleanup task:
// its allocation has ended; it stays waiting for the node's confirmation.
func (s *Service) failTask(ctx context.Context, tx pgx.Tx, a Allocation, t allocationsdb.GetTaskForDispatchRow, attempt int, code, reason string, move, cleanup bool) (lifecycle.Outcome, error) {
	if err := allocationsdb.New(tx).GiveUpTask(ctx, allocationsdb.GiveUpTaskParams{
		TaskID: t.TaskID, Attempts: int32(attempt), LastError: ptr(reason), FinishedAt: ptr(s.now()),
	}); err != nil {
		return lifecycle.Outcome{}, fmt.Errorf("give up task: %w", err)
	}
	ev, typ := failureOf(t.Kind)
	if !move || ev == "" || t.Cleanup {
		return lifecycle.Outcome{}, nil
	}
	a, out, err := s.transitionCleanup(ctx, tx, a, ev, Actor{Type: ActorSystem}, reason, cleanup)
	if err != nil || typ == "" {
		return out, err
	}
	if _, err := s.Outbox.Enqueue(ctx, tx, outbox.Event{Type: typ, Subject: "gantry.events." + typ, Payload: map[string]any{
		"allocation_id": a.ID.String(), "tenant_id": a.TenantID.String(), "project_id": a.ProjectID.String(),
		"node_id": a.NodeID.String(), "task_id": t.TaskID.String(), "task_kind": t.Kind,
		"reason_code": code, "reason": reason, "status": a.Status,
	}}); err != nil {
		return out, fmt.Errorf("enqueue %s: %w", typ, err)
	}
	return out, nil
}

// failureOf is the lifecycle event and the provisioning.* event type of a failed task of
// kind ("" where there is none).
func failureOf(kind string) (lifecycle.Event, string) {
	switch kind {
	case TaskProvision:
		return lifecycle.ProvisionFailed, ProvisioningFailedEvent
	case TaskRelease:
		return lifecycle.ReleaseFailedEv, ReleaseFailedEvent
	case TaskRestart:
		return lifecycle.RestartFailedEv, ""
	}
	return "", ""
}

// onTask runs fn in a transaction holding the task's allocation locked, with the task
// read again under the lock: every change to an allocation's tasks happens under that
// lock, so fn sees the task as it is (acknowledged by another replica, overtaken by the
// agent's report) and cannot race them. A drain waiting for the GPUs fn freed is settled
// after the commit.
func (s *Service) onTask(ctx context.Context, taskID uuid.UUID,
	fn func(tx pgx.Tx, a Allocation, t allocationsdb.GetTaskForDispatchRow) (lifecycle.Outcome, error)) (lifecycle.Outcome, error) {
	var out lifecycle.Outcome
	var nodeID uuid.UUID
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := allocationsdb.New(tx)
		// The task's allocation never changes: its lock is taken through the task.
		a, err := q.LockTaskAllocation(ctx, taskID)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %s", ErrUnknownTask, taskID)
		}
		if err != nil {
			return fmt.Errorf("lock allocation: %w", err)
		}
		nodeID = a.NodeID
		t, err := q.GetTaskForDispatch(ctx, taskID)
		if err != nil {
			return fmt.Errorf("load task: %w", err)
		}
		out, err = fn(tx, a, t)
		return err
	})
	if err != nil {
		return lifecycle.Outcome{}, err
	}
	if out.Changed && !lifecycle.HoldsGPUs(out.To) {
		s.settleDrain(ctx, nodeID)
	}
	return out, nil
}

// humanDuration writes whole minutes and seconds the way people say them ("10m",
// "90s"), anything else as time.Duration does.
func humanDuration(d time.Duration) string {
	switch {
	case d > 0 && d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d > 0 && d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	case d > 0 && d%time.Second == 0:
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return d.String()
}
