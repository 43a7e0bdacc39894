package allocations

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/allocationsdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/lifecycle"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/alloctask"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// ProvisionResult is the result payload (JSON) of a succeeded provision or restart
// task: how the user reaches the workload.
type ProvisionResult = alloctask.ProvisionResult

// ErrUnknownTask is a report for a task this control plane did not send to that node.
var ErrUnknownTask = errors.New("allocations: report for an unknown task")

const maxReason = 1024

// TaskResult applies an agent's report of an allocation task (fabric.Deps.OnTaskResult):
// provision succeeded → active (connection details stored, usage opens), provision
// failed → failed (GPUs freed), release succeeded → released (GPUs freed, usage
// closes), release failed → release_failed (usage closes, reason shown). A report that
// repeats the persisted status writes nothing; one that does not fit the lifecycle is
// refused (the caller logs and drops it).
func (s *Service) TaskResult(ctx context.Context, nodeID uuid.UUID, r *fabricv1.TaskResult) error {
	taskID, err := uuid.Parse(r.GetTaskId())
	if err != nil {
		return fmt.Errorf("%w: task id %q", ErrUnknownTask, r.GetTaskId())
	}
	task, err := s.read(ctx).GetTask(ctx, taskID)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && task.NodeID != nodeID) {
		return fmt.Errorf("%w: %s from node %s", ErrUnknownTask, taskID, nodeID)
	}
	if err != nil {
		return fmt.Errorf("load task: %w", err)
	}
	ok := r.GetStatus() == fabricv1.TaskResultStatus_TASK_RESULT_STATUS_SUCCEEDED
	if task.Cleanup {
		return s.cleanupReported(ctx, nodeID, task, ok, truncate(fmt.Sprintf("%s: %s", r.GetErrorCode(), r.GetMessage()), maxReason))
	}
	var ev lifecycle.Event
	switch {
	case task.Kind == TaskProvision && ok:
		ev = lifecycle.Provisioned
	case task.Kind == TaskProvision:
		ev = lifecycle.ProvisionFailed
	case task.Kind == TaskRelease && ok:
		ev = lifecycle.ReleaseOK
	case task.Kind == TaskRelease:
		ev = lifecycle.ReleaseFailedEv
	case task.Kind == TaskRestart && ok:
		ev = lifecycle.RestartOK
	case task.Kind == TaskRestart:
		ev = lifecycle.RestartFailedEv
	default:
		// A stop task's report changes no status (the allocation is already stopped and
		// billing closed when it entered stopped); it only finishes the task.
		return s.finishTask(ctx, taskID)
	}
	reason := ""
	if !ok {
		reason = truncate(fmt.Sprintf("%s: %s", r.GetErrorCode(), r.GetMessage()), maxReason)
	}
	var conn ProvisionResult
	if (ev == lifecycle.Provisioned || ev == lifecycle.RestartOK) && len(r.GetResult()) > 0 {
		if err := json.Unmarshal(r.GetResult(), &conn); err != nil {
			return fmt.Errorf("provision result of task %s: %w", taskID, err)
		}
	}
	_, _, err = s.applyWith(ctx, task.AllocationID, nil, ev, Actor{Type: ActorNode, ID: nodeID.String()}, reason,
		func(tx pgx.Tx, a Allocation, out lifecycle.Outcome) error {
			q := allocationsdb.New(tx)
			if out.Changed && (ev == lifecycle.Provisioned || ev == lifecycle.RestartOK) && conn.Host != "" && conn.Port > 0 && conn.Port < 65536 && conn.User != "" {
				if err := q.SetConnection(ctx, allocationsdb.SetConnectionParams{
					ID: a.ID, ConnectionHost: ptr(truncate(conn.Host, 255)), ConnectionPort: pgtype.Int4{Int32: int32(conn.Port), Valid: true},
					ConnectionUser: ptr(truncate(conn.User, 64)),
				}); err != nil {
					return fmt.Errorf("store connection: %w", err)
				}
			}
			return q.FinishTask(ctx, allocationsdb.FinishTaskParams{TaskID: taskID, FinishedAt: ptr(s.now())})
		})
	if _, refused := apierr.As(err); refused && ok && (ev == lifecycle.Provisioned || ev == lifecycle.RestartOK) {
		// The workload is up on the node, for an allocation that has ended meanwhile (the
		// report timeout failed it, say): the node must clean it up before its GPUs are
		// given to anyone else (cleanup.go).
		if cerr := s.cleanupHeld(ctx, task.AllocationID, nodeID); cerr != nil {
			return cerr
		}
	}
	if ev == lifecycle.ReleaseOK {
		// The node released the workload: that confirms it gone, also for an allocation
		// force-released while its release task was out (cleanup pending).
		if _, cerr := s.confirmGone(ctx, task.AllocationID, "release task "+taskID.String()); cerr != nil && err == nil {
			err = cerr
		}
	}
	return err
}

// finishTask records that the agent reported on a task that moves no status.
func (s *Service) finishTask(ctx context.Context, taskID uuid.UUID) error {
	return allocationsdb.New(s.Pool).FinishTask(ctx, allocationsdb.FinishTaskParams{TaskID: taskID, FinishedAt: ptr(s.now())})
}

// OnTaskResult is TaskResult shaped for fabric.Deps.OnTaskResult: nil when the report is
// recorded — committed, a repeat that changed nothing, or refused for good (an unknown
// task, a move the lifecycle does not allow, a result that does not parse: logged and
// dropped, since sending it again cannot change the answer) — so the fabric
// acknowledges it and the agent forgets it. Any other failure (the database unavailable)
// is returned: the report is not acknowledged, and the agent sends it again.
func (s *Service) OnTaskResult(ctx context.Context, nodeID uuid.UUID, r *fabricv1.TaskResult) error {
	err := s.TaskResult(ctx, nodeID, r)
	if err == nil {
		return nil
	}
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	if _, refused := apierr.As(err); refused || errors.Is(err, ErrUnknownTask) || errors.As(err, &syntax) || errors.As(err, &typ) {
		s.Log.WarnContext(ctx, "allocation task report dropped", "node_id", nodeID, "task_id", r.GetTaskId(), "err", err)
		return nil
	}
	return err
}

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
