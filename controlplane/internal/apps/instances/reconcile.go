package instances

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances/lifecycle"
	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/loop"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// reconcileBatch bounds the instances and tasks one pass reads.
const reconcileBatch = 500

// Run runs the reconcile pass every Config.ReconcileInterval until ctx ends.
func (s *Service) Run(ctx context.Context) {
	loop.Every(ctx, s.Config.ReconcileInterval, s.Log, "app instances reconcile", s.Reconcile)
}

// Reconcile is one pass, safe on every replica at once: it starts requested instances
// whose allocation runs, stops live instances whose allocation ended, fails instances
// not healthy within the health timeout, and delivers pending node tasks.
func (s *Service) Reconcile(ctx context.Context) error {
	return errors.Join(s.followAllocations(ctx), s.expireUnhealthy(ctx), s.deliver(ctx))
}

type liveRef struct {
	id, project, allocation uuid.UUID
	state                   lifecycle.State
}

// followAllocations moves live instances after their allocation: start when it runs (a
// requested instance), allocation_ended when it ended. It walks every live instance, a
// page at a time.
func (s *Service) followAllocations(ctx context.Context) error {
	var errs []error
	seen := map[uuid.UUID]allocations.Allocation{}
	after := uuid.Nil
	for {
		refs, err := s.livePage(ctx, after)
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		errs = append(errs, s.follow(ctx, refs, seen))
		if len(refs) < reconcileBatch {
			return errors.Join(errs...)
		}
		after = refs[len(refs)-1].id
	}
}

func (s *Service) livePage(ctx context.Context, after uuid.UUID) ([]liveRef, error) {
	rows, err := s.Pool.Query(ctx, `SELECT id, project_id, allocation_id, state FROM app_instances
		WHERE state NOT IN ('stopped', 'failed') AND id > $1 ORDER BY id LIMIT $2`, after, reconcileBatch)
	if err != nil {
		return nil, fmt.Errorf("live app instances: %w", err)
	}
	refs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (liveRef, error) {
		var l liveRef
		var st string
		err := r.Scan(&l.id, &l.project, &l.allocation, &st)
		l.state = lifecycle.State(st)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("live app instances: %w", err)
	}
	return refs, nil
}

func (s *Service) follow(ctx context.Context, refs []liveRef, seen map[uuid.UUID]allocations.Allocation) error {
	var errs []error
	for _, ref := range refs {
		a, ok := seen[ref.allocation]
		if !ok {
			var err error
			a, err = s.Allocations.Get(ctx, ref.project, ref.allocation)
			switch {
			case apierr.CodeOf(err) == apierr.AllocationNotFound:
				a.Status = "released" // gone (its project deleted): nothing runs there any more
			case err != nil:
				errs = append(errs, err)
				continue
			}
			seen[ref.allocation] = a
		}
		switch {
		case allocationEnded(a.Status):
			errs = append(errs, s.apply(ctx, ref.id, move{event: lifecycle.AllocationEnded, reason: "allocation_" + a.Status, actorType: audit.ActorSystem}, nil))
		case ref.state == lifecycle.Requested && allocationRuns(a.Status):
			errs = append(errs, s.within(ctx, func(tx pgx.Tx) error {
				i, err := lock(ctx, tx, ref.id)
				if err != nil || i.State != lifecycle.Requested {
					return err
				}
				return s.requestStart(ctx, tx, i, a.SshPublicKeys)
			}))
		}
	}
	return errors.Join(errs...)
}

// apply locks the instance and applies m unless its state changed meanwhile (another
// replica's pass): a refusal is not an error here. after, when set, runs in the same
// transaction after a change.
func (s *Service) apply(ctx context.Context, id uuid.UUID, m move, after func(tx pgx.Tx, i Instance) error) error {
	return s.within(ctx, func(tx pgx.Tx) error {
		i, err := lock(ctx, tx, id)
		if err != nil {
			return err
		}
		i, out, err := s.transition(ctx, tx, i, m)
		if _, refused := apierr.As(err); refused {
			return nil
		}
		if err != nil || !out.Changed || after == nil {
			return err
		}
		return after(tx, i)
	})
}

// expireUnhealthy fails instances that have been starting or unhealthy for longer than
// the health timeout: never healthy, or unhealthy and not recovering (a crash loop the
// agent did not give up on, or an agent that stopped reporting).
func (s *Service) expireUnhealthy(ctx context.Context) error {
	// Per instance: the larger of the configured timeout and the version's startup
	// timeout.
	rows, err := s.Pool.Query(ctx, `SELECT id, running_at IS NULL FROM app_instances
		WHERE state IN ('starting', 'unhealthy') AND not_ready_since < $1::timestamptz - make_interval(secs =>
			greatest($2::bigint, coalesce((run_spec->'health'->>'startup_timeout_seconds')::bigint, 0)))
		ORDER BY not_ready_since LIMIT $3`, s.now(), int64(s.Config.HealthTimeout/time.Second), reconcileBatch)
	if err != nil {
		return fmt.Errorf("unhealthy app instances: %w", err)
	}
	type late struct {
		id    uuid.UUID
		never bool
	}
	lates, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (late, error) {
		var l late
		return l, r.Scan(&l.id, &l.never)
	})
	if err != nil {
		return fmt.Errorf("unhealthy app instances: %w", err)
	}
	var errs []error
	for _, l := range lates {
		reason := fmt.Sprintf("unhealthy_timeout: not healthy again within %s", s.Config.HealthTimeout)
		if l.never {
			reason = fmt.Sprintf("never_healthy: the health check did not pass within %s", s.Config.HealthTimeout)
		}
		if err := s.apply(ctx, l.id, move{event: lifecycle.HealthTimeout, reason: reason, actorType: audit.ActorSystem}, nil); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

type pendingTask struct {
	id, instance, node uuid.UUID
	kind, contentType  string
	payload            []byte
	createdAt          time.Time
	attempts           int
	state              lifecycle.State
}

// deliver sends pending tasks to their nodes. A task whose instance moved on (a start
// for an instance no longer starting) is settled without delivery; one not acknowledged
// within the task timeout is given up (a start fails its instance).
func (s *Service) deliver(ctx context.Context) error {
	if s.Dispatcher == nil {
		return nil
	}
	var errs []error
	after := uuid.Nil
	for {
		tasks, err := s.pendingPage(ctx, after)
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		for _, t := range tasks {
			errs = append(errs, s.deliverOne(ctx, t))
		}
		if len(tasks) < reconcileBatch {
			return errors.Join(errs...)
		}
		after = tasks[len(tasks)-1].id
	}
}

// pendingPage is a page of the tasks not yet acknowledged or finished, by task id (ids
// are UUIDv7: creation order).
func (s *Service) pendingPage(ctx context.Context, after uuid.UUID) ([]pendingTask, error) {
	rows, err := s.Pool.Query(ctx, `SELECT t.task_id, t.instance_id, t.node_id, t.kind, t.content_type, t.payload, t.created_at,
		t.attempts, i.state FROM app_instance_tasks t JOIN app_instances i ON i.id = t.instance_id
		WHERE t.acked_at IS NULL AND t.finished_at IS NULL AND t.task_id > $1 ORDER BY t.task_id LIMIT $2`, after, reconcileBatch)
	if err != nil {
		return nil, fmt.Errorf("pending app tasks: %w", err)
	}
	tasks, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pendingTask, error) {
		var t pendingTask
		var st string
		err := r.Scan(&t.id, &t.instance, &t.node, &t.kind, &t.contentType, &t.payload, &t.createdAt, &t.attempts, &st)
		t.state = lifecycle.State(st)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("pending app tasks: %w", err)
	}
	return tasks, nil
}

func (s *Service) deliverOne(ctx context.Context, t pendingTask) error {
	now := s.now()
	if t.kind == TaskStart && (lifecycle.IsFinal(t.state) || t.state == lifecycle.Stopping) {
		return s.settle(ctx, t.id, false, "superseded: the instance is "+string(t.state))
	}
	deadline := t.createdAt.Add(s.Config.TaskTimeout)
	if now.After(deadline) {
		if err := s.settle(ctx, t.id, false, "task_timeout: the node did not take the task in time"); err != nil {
			return err
		}
		if t.kind != TaskStart {
			return nil
		}
		return s.apply(ctx, t.instance, move{event: lifecycle.ReportedFailed, reason: "start_timeout: the node did not take the app.start task in time",
			actorType: audit.ActorSystem}, nil)
	}
	ack, err := s.Dispatcher.Dispatch(ctx, t.node, &fabricv1.TaskDispatch{
		TaskId: t.id.String(), Kind: t.kind, Payload: t.payload, ContentType: t.contentType,
		Attempt: uint32(t.attempts + 1), Deadline: timestamppb.New(deadline),
	})
	if err != nil {
		_, uerr := s.Pool.Exec(ctx, `UPDATE app_instance_tasks SET attempts = attempts + 1, last_error = $2 WHERE task_id = $1`,
			t.id, truncate(err.Error(), 1024))
		return uerr // the node is offline or slow: the next pass tries again
	}
	switch ack.GetStatus() {
	case fabricv1.TaskAckStatus_TASK_ACK_STATUS_ACCEPTED, fabricv1.TaskAckStatus_TASK_ACK_STATUS_DUPLICATE:
		return s.taken(ctx, t, now)
	}
	reason := truncate(fmt.Sprintf("%s: %s", ack.GetErrorCode(), ack.GetMessage()), 1024)
	if err := s.settle(ctx, t.id, false, "rejected: "+reason); err != nil {
		return err
	}
	if t.kind != TaskStart {
		return nil
	}
	return s.apply(ctx, t.instance, move{event: lifecycle.ReportedFailed, reason: "start_rejected: " + reason, actorType: audit.ActorNode}, nil)
}

// taken records the node's acknowledgement of t: an app.start moves a requested instance
// to starting; one whose instance ended while the task was on its way is followed by an
// app.stop, so nothing runs for an instance that is over.
func (s *Service) taken(ctx context.Context, t pendingTask, now time.Time) error {
	return s.within(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE app_instance_tasks SET attempts = attempts + 1, acked_at = coalesce(acked_at, $2) WHERE task_id = $1`,
			t.id, now); err != nil {
			return fmt.Errorf("ack app task: %w", err)
		}
		if t.kind != TaskStart {
			return nil
		}
		i, err := lock(ctx, tx, t.instance)
		if err != nil {
			return err
		}
		_, _, err = s.transition(ctx, tx, i, move{event: lifecycle.Start, actorType: audit.ActorNode, meta: map[string]any{"task_id": t.id.String()}})
		if _, refused := apierr.As(err); refused && (lifecycle.IsFinal(i.State) || i.State == lifecycle.Stopping) {
			_, err = s.enqueueStop(ctx, tx, i)
		}
		return err
	})
}

// settle finishes a task without a result from the agent.
func (s *Service) settle(ctx context.Context, taskID uuid.UUID, ok bool, why string) error {
	_, err := s.Pool.Exec(ctx, `UPDATE app_instance_tasks SET finished_at = $2, succeeded = $3, last_error = $4
		WHERE task_id = $1 AND finished_at IS NULL`, taskID, s.now(), ok, truncate(why, 1024))
	return err
}
