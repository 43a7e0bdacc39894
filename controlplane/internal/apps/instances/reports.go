package instances

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances/lifecycle"
	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Controller is the ControllerReport.controller of app instance reports.
const Controller = apptask.Controller

// ErrUnknownInstance is a report about an instance this control plane did not place on
// the reporting node (or a malformed id).
var ErrUnknownInstance = errors.New("instances: report for an unknown app instance")

// ErrUnknownTask is a task result for a task this feature did not send to that node.
var ErrUnknownTask = errors.New("instances: result for an unknown task")

// Report is one controller report about an app instance, as the agent observed it.
type Report struct {
	InstanceID uuid.UUID
	// State is the observed state: starting, running, unhealthy, stopped or failed.
	State   string
	Message string
	// Reason is the agent's machine-readable cause of failed or stopped
	// (apptask.Reason*).
	Reason string
	// Restarts is how often the supervisor restarted the process (telemetry).
	Restarts   int
	Generation uint64
	ObservedAt time.Time
}

// ApplyReport applies the agent's report about an instance on nodeID. A report whose
// state the instance already has is telemetry: the report's generation, restart count
// and time are stored, and no audit row is written. A report that moves the state writes
// the move with one app_instance.controller_report audit row (seed §6.2 rule 1). A
// report that does not fit the lifecycle returns its 409 error (the caller logs and
// drops it); one about an instance unknown on that node returns ErrUnknownInstance.
func (s *Service) ApplyReport(ctx context.Context, nodeID uuid.UUID, r Report) (lifecycle.Outcome, error) {
	ev := lifecycle.FromReport(r.State)
	if ev == "" {
		return lifecycle.Outcome{}, apierr.New(apierr.InvalidRequest, "unknown app instance state %q", r.State).
			WithStatus(409).With("reason", "app_instance_transition_invalid")
	}
	var out lifecycle.Outcome
	var refusal error // a refused report whose transaction still commits (an orphan's stop)
	err := s.within(ctx, func(tx pgx.Tx) error {
		i, err := lock(ctx, tx, r.InstanceID)
		if apierr.CodeOf(err) == apierr.AppInstanceNotFound || (err == nil && i.NodeID != nodeID) {
			return fmt.Errorf("%w: %s from node %s", ErrUnknownInstance, r.InstanceID, nodeID)
		}
		if err != nil {
			return err
		}
		reason := ""
		if r.State == string(lifecycle.Failed) || r.State == string(lifecycle.Unhealthy) || r.State == string(lifecycle.Stopped) {
			reason = r.Reason
			if r.Message != "" {
				reason = strings.TrimPrefix(reason+": "+r.Message, ": ")
			}
		}
		meta := map[string]any{"generation": r.Generation, "restarts": r.Restarts}
		ended := i
		i, out, err = s.transition(ctx, tx, i, move{event: ev, reason: reason, actorType: audit.ActorNode, meta: meta})
		if _, refused := apierr.As(err); refused && lifecycle.IsFinal(ended.State) && apptask.Live(r.State) {
			// The node runs a process for an instance that is over (its stop was lost, or
			// it ended with its allocation while the node kept it): stop it there. The
			// report itself is still refused (the caller logs it).
			refusal = err
			return s.stopOrphan(ctx, tx, ended)
		}
		if err != nil {
			return err
		}
		// Telemetry: stored on every report, audited never.
		observed := r.ObservedAt
		if observed.IsZero() {
			observed = s.now()
		}
		_, err = tx.Exec(ctx, `UPDATE app_instances SET restart_count = $2, report_generation = $3, last_report_at = $4 WHERE id = $1`,
			i.ID, max(r.Restarts, 0), int64(r.Generation), observed.UTC())
		return err
	})
	if err == nil && refusal != nil {
		return out, refusal
	}
	return out, err
}

// stopOrphan enqueues an app.stop for an ended instance unless one is still pending.
func (s *Service) stopOrphan(ctx context.Context, tx pgx.Tx, i Instance) error {
	var pending bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM app_instance_tasks WHERE instance_id = $1 AND kind = 'app.stop'
		AND finished_at IS NULL)`, i.ID).Scan(&pending); err != nil || pending {
		return err
	}
	_, err := s.enqueueStop(ctx, tx, i)
	return err
}

// ApplyControllerReport is ApplyReport for a fabric ControllerReport of controller
// app_instance (the fabric's report hook calls it); ErrUnknownInstance for any other
// controller or a malformed id.
func (s *Service) ApplyControllerReport(ctx context.Context, nodeID uuid.UUID, r *fabricv1.ControllerReport) error {
	if r.GetController() != Controller {
		return fmt.Errorf("%w: controller %q", ErrUnknownInstance, r.GetController())
	}
	id, err := uuid.Parse(r.GetObjectId())
	if err != nil {
		return fmt.Errorf("%w: object id %q", ErrUnknownInstance, r.GetObjectId())
	}
	st := r.GetAppInstance()
	rep := Report{InstanceID: id, State: r.GetState(), Message: truncate(r.GetMessage(), apptask.MaxMessageBytes), Reason: st.GetReason(),
		Restarts: int(min(st.GetRestarts(), 1<<30)), Generation: r.GetGeneration()}
	if ts := r.GetObservedAt(); ts != nil {
		rep.ObservedAt = ts.AsTime()
	}
	_, err = s.ApplyReport(ctx, nodeID, rep)
	return err
}

// TaskResult records the agent's result of an app task. A failed app.start fails the
// instance with the agent's reason; a succeeded app.stop stops a stopping instance (the
// agent's controller report says the same, whichever comes first). ErrUnknownTask for a
// task this feature did not send to nodeID (the fabric hook then offers the result to
// allocations).
func (s *Service) TaskResult(ctx context.Context, nodeID uuid.UUID, r *fabricv1.TaskResult) error {
	taskID, err := uuid.Parse(r.GetTaskId())
	if err != nil {
		return fmt.Errorf("%w: task id %q", ErrUnknownTask, r.GetTaskId())
	}
	ok := r.GetStatus() == fabricv1.TaskResultStatus_TASK_RESULT_STATUS_SUCCEEDED
	return s.within(ctx, func(tx pgx.Tx) error {
		var instanceID, taskNode uuid.UUID
		var kind string
		var finished bool
		err := tx.QueryRow(ctx, `SELECT instance_id, node_id, kind, finished_at IS NOT NULL FROM app_instance_tasks WHERE task_id = $1 FOR UPDATE`,
			taskID).Scan(&instanceID, &taskNode, &kind, &finished)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && taskNode != nodeID) {
			return fmt.Errorf("%w: %s from node %s", ErrUnknownTask, taskID, nodeID)
		}
		if err != nil {
			return fmt.Errorf("load app task: %w", err)
		}
		if finished {
			return nil // a repeated result
		}
		errText := ""
		if !ok {
			errText = truncate(fmt.Sprintf("%s: %s", r.GetErrorCode(), r.GetMessage()), 1024)
		}
		if _, err := tx.Exec(ctx, `UPDATE app_instance_tasks SET finished_at = $2, succeeded = $3, last_error = nullif($4, '') WHERE task_id = $1`,
			taskID, s.now(), ok, errText); err != nil {
			return fmt.Errorf("finish app task: %w", err)
		}
		var ev lifecycle.Event
		switch {
		case kind == TaskStart && !ok:
			ev = lifecycle.ReportedFailed
		case kind == TaskStop && ok:
			ev = lifecycle.ReportedStopped
		default:
			return nil
		}
		i, err := lock(ctx, tx, instanceID)
		if err != nil {
			return err
		}
		if kind == TaskStop && i.State != lifecycle.Stopping {
			return nil // a stop after a health timeout: the instance has already failed
		}
		_, _, err = s.transition(ctx, tx, i, move{event: ev, reason: errText, actorType: audit.ActorNode,
			meta: map[string]any{"task_id": taskID.String(), "task_kind": kind}})
		if _, refused := apierr.As(err); refused {
			return nil // the instance moved on meanwhile; the result is recorded
		}
		return err
	})
}
