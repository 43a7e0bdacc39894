package attach

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/loop"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/attach/attachdb"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/alloctask"
	"github.com/gantry-gpu/gantry/shared/correlation"
)

// How the storage.attach / storage.detach tasks reach the node. They are allocation
// tasks on the wire (shared/alloctask, fabric TaskDispatch and TaskResult) but change no
// allocation status, so their bookkeeping lives on the attachment row (task_id,
// task_acked_at, task_attempts) rather than in allocation_tasks: the request that makes
// one sends it right after its commit, and Run's sweep sends again what no agent
// acknowledged (an agent dedupes on the task id), fails what was not acknowledged or
// reported within Config.TaskTimeout, and detaches what an ended allocation left.

// ErrUnknownTask is a result for a task that is not an attachment's.
var ErrUnknownTask = errors.New("attach: result for an unknown task")

const (
	maxError      = 1024
	attemptTimout = 10 * time.Second
	sweepBatch    = 100
)

// sendSoon delivers a's task, if it wants one, after the commit and off the request.
func (s *Service) sendSoon(ctx context.Context, a Attachment) {
	if s.Fabric == nil || !a.TaskID.Valid {
		return
	}
	ctx = context.WithoutCancel(ctx)
	s.inflight.Add(1)
	go func() {
		defer s.inflight.Done()
		if err := s.deliver(ctx, a.ID); err != nil {
			s.Log.WarnContext(ctx, "storage task not delivered; the sweep retries", "attachment_id", a.ID, "err", err)
		}
	}()
}

// Wait waits for the deliveries sendSoon started.
func (s *Service) Wait() { s.inflight.Wait() }

// deliver sends the attachment's current task to its node once: acknowledged, refused
// (the attachment moves as for a failure), or recorded as an attempt that did not arrive.
func (s *Service) deliver(ctx context.Context, id uuid.UUID) error {
	q := attachdb.New(s.Pool)
	t, err := q.TaskToDeliver(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // no task wanted, or acknowledged already
	}
	if err != nil {
		return fmt.Errorf("load task: %w", err)
	}
	taskID := t.TaskID.UUID
	deadline := t.TaskCreatedAt.Add(s.Config.TaskTimeout)
	if !s.now().Before(deadline) {
		_, err := s.taskEnded(ctx, taskID, false, "storage_task_timeout", "the node did not acknowledge the task within "+s.Config.TaskTimeout.String(), alloctask.StorageResult{})
		return err
	}
	payload, err := json.Marshal(alloctask.StoragePayload{
		AllocationID: t.AllocationID.String(), User: alloctask.UserName(t.AllocationID.String()),
		AttachmentID: t.ID.String(), BucketID: t.BucketID, Mode: t.Mode, MountPath: t.MountPath,
	})
	if err != nil {
		return err
	}
	attempt := int(t.TaskAttempts) + 1
	dctx, cancel := context.WithTimeout(ctx, attemptTimout)
	ack, err := s.Fabric.Dispatch(dctx, t.NodeID, &fabricv1.TaskDispatch{
		TaskId: taskID.String(), Kind: *t.TaskKind, Payload: payload, ContentType: alloctask.ContentType,
		Attempt: uint32(attempt), Deadline: timestamppb.New(deadline), CorrelationId: correlation.ID(ctx),
	})
	cancel()
	if err != nil {
		if rerr := q.RecordTaskAttempt(ctx, attachdb.RecordTaskAttemptParams{
			TaskID: t.TaskID, Attempts: int32(attempt), LastError: ptr(truncate(err.Error(), maxError)),
		}); rerr != nil {
			return rerr
		}
		return err
	}
	switch ack.GetStatus() {
	case fabricv1.TaskAckStatus_TASK_ACK_STATUS_ACCEPTED, fabricv1.TaskAckStatus_TASK_ACK_STATUS_DUPLICATE:
		return q.MarkTaskAcked(ctx, attachdb.MarkTaskAckedParams{TaskID: t.TaskID, AckedAt: ptr(s.now()), Attempts: int32(attempt)})
	case fabricv1.TaskAckStatus_TASK_ACK_STATUS_REJECTED:
		_, err := s.taskEnded(ctx, taskID, false, ack.GetErrorCode(), ack.GetMessage(), alloctask.StorageResult{})
		return err
	}
	return fmt.Errorf("unexpected ack status %s", ack.GetStatus())
}

// OnTaskResult records an agent's result of a storage task (routed here by fabric's
// OnTaskResult before allocations sees it). handled is false when the task is not an
// attachment's (allocations then takes it). A nil error means recorded: committed, a
// repeat, or refused for good (a stale task, a move the state table does not allow),
// so the agent may forget it; any other error leaves it for the agent to send again.
func (s *Service) OnTaskResult(ctx context.Context, nodeID uuid.UUID, r *fabricv1.TaskResult) (handled bool, err error) {
	taskID, perr := uuid.Parse(r.GetTaskId())
	if perr != nil {
		return false, nil
	}
	row, err := attachdb.New(s.Pool).AttachmentByTask(ctx, uuid.NullUUID{UUID: taskID, Valid: true})
	if errors.Is(err, pgx.ErrNoRows) {
		// Not an attachment's current task: allocations' (or a stale storage task, whose
		// result changes nothing: allocations drops it as unknown).
		return false, nil
	}
	if err != nil {
		return true, fmt.Errorf("load attachment task: %w", err)
	}
	if row.NodeID != nodeID {
		s.Log.WarnContext(ctx, "storage task result from another node dropped", "task_id", taskID, "node_id", nodeID)
		return true, nil
	}
	ok := r.GetStatus() == fabricv1.TaskResultStatus_TASK_RESULT_STATUS_SUCCEEDED
	var res alloctask.StorageResult
	if len(r.GetResult()) > 0 {
		if jerr := json.Unmarshal(r.GetResult(), &res); jerr != nil && ok {
			s.Log.WarnContext(ctx, "storage task result does not parse", "task_id", taskID, "err", jerr)
		}
	}
	_, err = s.taskEnded(ctx, taskID, ok, r.GetErrorCode(), r.GetMessage(), res)
	var refused ErrRefused
	if errors.As(err, &refused) {
		s.Log.WarnContext(ctx, "storage task result does not fit the attachment's state; dropped", "task_id", taskID, "err", err)
		return true, nil
	}
	return true, err
}

// taskEnded applies the end of the attachment's current task taskID: succeeded or
// failed (code, message) as reported or decided here (refused, timed out). A task that is
// no longer the attachment's current one changes nothing.
func (s *Service) taskEnded(ctx context.Context, taskID uuid.UUID, ok bool, code, message string, res alloctask.StorageResult) (bool, error) {
	changed := false
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := attachdb.New(tx)
		row, err := q.AttachmentByTask(ctx, uuid.NullUUID{UUID: taskID, Valid: true})
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		if _, err := q.LockAllocation(ctx, row.AllocationID); err != nil {
			return fmt.Errorf("lock allocation: %w", err)
		}
		cur, err := q.LockAttachment(ctx, row.ID)
		if err != nil {
			return fmt.Errorf("lock attachment: %w", err)
		}
		if !cur.TaskID.Valid || cur.TaskID.UUID != taskID {
			return nil // superseded meanwhile
		}
		var ev Event
		c := change{actorType: audit.ActorNode, metadata: map[string]any{"task_id": taskID.String()}}
		switch {
		case *cur.TaskKind == alloctask.KindStorageAttach && ok:
			ev, c.method, c.hostPath = AttachOK, res.Method, res.MountPath
		case *cur.TaskKind == alloctask.KindStorageAttach:
			ev = AttachFailed
		case ok:
			ev = DetachOK
		default:
			ev = DetachFailed
		}
		if !ok {
			c.err = truncate(fmt.Sprintf("%s: %s", code, message), maxError)
		}
		if c.method != alloctask.StorageMethodFUSE && c.method != alloctask.StorageMethodCopy {
			c.method = ""
		}
		if len(c.hostPath) > 4096 {
			c.hostPath = ""
		}
		action := "storage_attachment." + string(ev)
		_, changed, err = s.apply(ctx, tx, cur, ev, c, action)
		return err
	})
	return changed, err
}

// Run redelivers, times out and catches up every Config.SweepInterval until ctx ends.
// Every replica runs it; each pass is idempotent.
func (s *Service) Run(ctx context.Context) {
	loop.Every(ctx, s.Config.SweepInterval, s.Log, "storage attachment sweep", s.Sweep)
}

// Sweep is one pass of Run.
func (s *Service) Sweep(ctx context.Context) error {
	q := attachdb.New(s.Pool)
	now := s.now()
	var errs []error
	if s.Fabric != nil {
		pending, err := q.PendingTasks(ctx, attachdb.PendingTasksParams{Before: ptr(now.Add(-s.Config.RetryInterval)), MaxRows: sweepBatch})
		if err != nil {
			return fmt.Errorf("pending storage tasks: %w", err)
		}
		for _, p := range pending {
			if err := s.deliver(ctx, p.ID); err != nil && ctx.Err() == nil {
				s.Log.DebugContext(ctx, "storage task not delivered", "attachment_id", p.ID, "err", err)
			}
		}
	}
	unreported, err := q.UnreportedTasks(ctx, attachdb.UnreportedTasksParams{AckedBefore: ptr(now.Add(-s.Config.TaskTimeout)), MaxRows: sweepBatch})
	if err != nil {
		return fmt.Errorf("unreported storage tasks: %w", err)
	}
	for _, u := range unreported {
		if _, err := s.taskEnded(ctx, u.TaskID.UUID, false, "storage_task_timeout", "the node did not report within "+s.Config.TaskTimeout.String(), alloctask.StorageResult{}); err != nil {
			errs = append(errs, err)
		}
	}
	endedIDs, err := q.EndedAllocationsWithAttachments(ctx, sweepBatch)
	if err != nil {
		return fmt.Errorf("ended allocations: %w", err)
	}
	for _, id := range endedIDs {
		if err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
			if _, err := attachdb.New(tx).LockAllocation(ctx, id); err != nil {
				return err
			}
			return s.AllocationEnded(ctx, tx, id)
		}); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func ptr[T any](v T) *T { return &v }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	r := []rune(s)
	for len(string(r)) > n {
		r = r[:len(r)-1]
	}
	return string(r)
}
