package sharedruntimes

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/loop"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Operation kinds.
const (
	OpRestart              = "restart"
	OpDrain                = "drain"
	RepairRestartUnhealthy = "restart_unhealthy_workers"
	RepairReplaceFailed    = "replace_failed_workers"
	auditWorkerReport      = "shared_runtime.worker.report"
	auditWorkerOperation   = "shared_runtime.worker.operation"
	auditRepairOperation   = "shared_runtime.repair.operation"
	maxStateReason         = 1024
)

// Operation is a worker operation or a repair operation.
type Operation struct {
	ID          uuid.UUID
	RuntimeID   uuid.UUID
	WorkerID    uuid.UUID   // worker operations
	WorkerIDs   []uuid.UUID // repair operations
	Kind        string
	State       string
	StateReason *string
	RequestedBy uuid.UUID
	CreatedAt   time.Time
	UpdatedAt   time.Time
	FinishedAt  *time.Time
}

// ownerRuntime loads a runtime the project owns (operations are the owner's):
// app_not_found when the project may not see it, insufficient_permissions when it may
// but does not own it.
func (s *Service) ownerRuntime(ctx context.Context, proj projectctx.Project, id uuid.UUID) (Runtime, error) {
	r, err := s.Get(ctx, proj, id)
	if err != nil {
		return Runtime{}, err
	}
	if r.OwnerProjectID != proj.ID {
		return Runtime{}, apierr.Forbidden("only the runtime's owner project operates its workers")
	}
	return r, nil
}

func workerNotFound() *apierr.Error {
	return apierr.NotFound(apierr.AppNotFound, "worker").With("reason", "worker_not_found")
}

func (r Runtime) worker(id uuid.UUID) (Worker, bool) {
	for _, w := range r.Workers {
		if w.ID == id {
			return w, true
		}
	}
	return Worker{}, false
}

// CreateWorkerOperation queues a restart or drain of a worker (one in flight per
// worker: app_instance_state_invalid otherwise), audited.
func (s *Service) CreateWorkerOperation(ctx context.Context, proj projectctx.Project, actor, runtimeID, workerID uuid.UUID, kind string) (Operation, error) {
	r, err := s.ownerRuntime(ctx, proj, runtimeID)
	if err != nil {
		return Operation{}, err
	}
	if _, ok := r.worker(workerID); !ok {
		return Operation{}, workerNotFound()
	}
	op := Operation{ID: s.IDs.New(), RuntimeID: r.ID, WorkerID: workerID, Kind: kind, State: OpPending, RequestedBy: actor,
		CreatedAt: s.Clock.Now(), UpdatedAt: s.Clock.Now()}
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		if err := insertWorkerOp(ctx, tx, op, uuid.Nil); err != nil {
			return err
		}
		return s.Audit.Record(ctx, tx, audit.Entry{Action: auditWorkerOperation + ".create", TargetType: "shared_runtime", TargetID: r.ID.String(),
			TenantID: proj.TenantID, ProjectID: proj.ID, Metadata: map[string]any{"operation_id": op.ID.String(), "worker_id": workerID.String(), "kind": kind}})
	})
	if err != nil {
		return Operation{}, err
	}
	return op, nil
}

func insertWorkerOp(ctx context.Context, tx pgx.Tx, op Operation, repair uuid.UUID) error {
	_, err := tx.Exec(ctx, `INSERT INTO shared_runtime_worker_operations (id, shared_runtime_id, worker_id, kind, state, requested_by,
			created_at, updated_at, repair_operation_id) VALUES ($1, $2, $3, $4, 'pending', $5, $6, $6, $7)`,
		op.ID, op.RuntimeID, op.WorkerID, op.Kind, op.RequestedBy, op.CreatedAt, nullable(repair))
	if db.IsUniqueViolation(err, "shared_runtime_worker_operations_live_key") {
		return apierr.New(apierr.AppInstanceStateInvalid, "the worker has an operation in flight").With("reason", "operation_in_flight")
	}
	if err != nil {
		return fmt.Errorf("insert worker operation: %w", err)
	}
	return nil
}

// CreateRepairOperation queues a repair of the runtime (one in flight per runtime).
func (s *Service) CreateRepairOperation(ctx context.Context, proj projectctx.Project, actor, runtimeID uuid.UUID, kind string) (Operation, error) {
	r, err := s.ownerRuntime(ctx, proj, runtimeID)
	if err != nil {
		return Operation{}, err
	}
	op := Operation{ID: s.IDs.New(), RuntimeID: r.ID, WorkerIDs: []uuid.UUID{}, Kind: kind, State: OpPending, RequestedBy: actor,
		CreatedAt: s.Clock.Now(), UpdatedAt: s.Clock.Now()}
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO shared_runtime_repair_operations (id, shared_runtime_id, kind, state, requested_by, created_at, updated_at)
			VALUES ($1, $2, $3, 'pending', $4, $5, $5)`, op.ID, op.RuntimeID, op.Kind, actor, op.CreatedAt)
		if db.IsUniqueViolation(err, "shared_runtime_repair_operations_live_key") {
			return apierr.New(apierr.AppInstanceStateInvalid, "the runtime has a repair in flight").With("reason", "operation_in_flight")
		}
		if err != nil {
			return fmt.Errorf("insert repair operation: %w", err)
		}
		return s.Audit.Record(ctx, tx, audit.Entry{Action: auditRepairOperation + ".create", TargetType: "shared_runtime", TargetID: r.ID.String(),
			TenantID: proj.TenantID, ProjectID: proj.ID, Metadata: map[string]any{"operation_id": op.ID.String(), "kind": kind}})
	})
	if err != nil {
		return Operation{}, err
	}
	return op, nil
}

const workerOpColumns = `id, shared_runtime_id, worker_id, kind, state, state_reason, requested_by, created_at, updated_at, finished_at`
const repairColumns = `id, shared_runtime_id, worker_ids, kind, state, state_reason, requested_by, created_at, updated_at, finished_at`

func scanOp(row pgx.Row, repair bool) (Operation, error) {
	var o Operation
	var target any = &o.WorkerID
	if repair {
		target = &o.WorkerIDs
	}
	err := row.Scan(&o.ID, &o.RuntimeID, target, &o.Kind, &o.State, &o.StateReason, &o.RequestedBy, &o.CreatedAt, &o.UpdatedAt, &o.FinishedAt)
	if o.WorkerIDs == nil && repair {
		o.WorkerIDs = []uuid.UUID{}
	}
	return o, err
}

// WorkerOperation loads one operation of a worker of a runtime the project owns.
func (s *Service) WorkerOperation(ctx context.Context, proj projectctx.Project, runtimeID, workerID, id uuid.UUID) (Operation, error) {
	if _, err := s.ownerRuntime(ctx, proj, runtimeID); err != nil {
		return Operation{}, err
	}
	o, err := scanOp(db.Querier(ctx, s.Pool).QueryRow(ctx, `SELECT `+workerOpColumns+` FROM shared_runtime_worker_operations
		WHERE id = $1 AND shared_runtime_id = $2 AND worker_id = $3`, id, runtimeID, workerID), false)
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, apierr.NotFound(apierr.AppNotFound, "operation").With("reason", "operation_not_found")
	}
	return o, err
}

// RepairOperation loads one repair of a runtime the project owns.
func (s *Service) RepairOperation(ctx context.Context, proj projectctx.Project, runtimeID, id uuid.UUID) (Operation, error) {
	if _, err := s.ownerRuntime(ctx, proj, runtimeID); err != nil {
		return Operation{}, err
	}
	o, err := scanOp(db.Querier(ctx, s.Pool).QueryRow(ctx, `SELECT `+repairColumns+` FROM shared_runtime_repair_operations
		WHERE id = $1 AND shared_runtime_id = $2`, id, runtimeID), true)
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, apierr.NotFound(apierr.AppNotFound, "repair operation").With("reason", "operation_not_found")
	}
	return o, err
}

// ListOperations lists a worker's operations (workerID set) or the runtime's repairs.
func (s *Service) ListOperations(ctx context.Context, proj projectctx.Project, runtimeID, workerID, after uuid.UUID, repair bool, limit int) ([]Operation, bool, error) {
	r, err := s.ownerRuntime(ctx, proj, runtimeID)
	if err != nil {
		return nil, false, err
	}
	var rows pgx.Rows
	if repair {
		rows, err = db.Querier(ctx, s.Pool).Query(ctx, `SELECT `+repairColumns+` FROM shared_runtime_repair_operations
			WHERE shared_runtime_id = $1 AND id > $2 ORDER BY id LIMIT $3`, r.ID, after, limit+1)
	} else {
		if _, ok := r.worker(workerID); !ok {
			return nil, false, workerNotFound()
		}
		rows, err = db.Querier(ctx, s.Pool).Query(ctx, `SELECT `+workerOpColumns+` FROM shared_runtime_worker_operations
			WHERE shared_runtime_id = $1 AND worker_id = $2 AND id > $3 ORDER BY id LIMIT $4`, r.ID, workerID, after, limit+1)
	}
	if err != nil {
		return nil, false, fmt.Errorf("list operations: %w", err)
	}
	defer rows.Close()
	var out []Operation
	for rows.Next() {
		o, err := scanOp(rows, repair)
		if err != nil {
			return nil, false, err
		}
		out = append(out, o)
	}
	if err := rows.Err(); err != nil {
		return nil, false, err
	}
	more := len(out) > limit
	if more {
		out = out[:limit]
	}
	return out, more, nil
}

// Run syncs workers, carries operations forward and rates metered calls every
// interval until ctx ends.
func (s *Service) Run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = 2 * time.Second
	}
	loop.Every(ctx, interval, s.Log, "shared runtimes", func(ctx context.Context) error {
		if err := s.Sync(ctx); err != nil {
			return err
		}
		_, err := s.RateCalls(ctx, 1000)
		return err
	})
}

// workerState is the state a worker shows for its instance's state.
func workerState(instance string, draining bool) string {
	switch instance {
	case "requested", "starting":
		if draining {
			return WorkerDraining
		}
		return WorkerStarting
	case "running":
		if draining {
			return WorkerDraining
		}
		return WorkerRunning
	case "unhealthy":
		if draining {
			return WorkerDraining
		}
		return WorkerUnhealthy
	case "stopping":
		return WorkerDraining
	case "stopped":
		return WorkerStopped
	default:
		return WorkerFailed
	}
}

// Sync brings every worker's state in line with its app instance, and carries the
// operations forward. A worker's row changes, and is audited shared_runtime.worker.report,
// only when its state or reason changes: the same report again writes nothing.
func (s *Service) Sync(ctx context.Context) error {
	if err := s.syncWorkers(ctx); err != nil {
		return err
	}
	if err := s.advanceRepairs(ctx); err != nil {
		return err
	}
	return s.advanceWorkerOps(ctx)
}

type workerView struct {
	id, runtime, tenant, project uuid.UUID
	state                        string
	reason                       *string
	instState                    string
	instReason                   *string
	lastReport                   *time.Time
	draining                     bool // a drain operation is in flight
}

func (s *Service) syncWorkers(ctx context.Context) error {
	rows, err := s.Pool.Query(ctx, `SELECT w.id, w.shared_runtime_id, r.owner_tenant_id, r.owner_project_id, w.state, w.state_reason,
			i.state, i.state_reason, i.last_report_at,
			EXISTS (SELECT 1 FROM shared_runtime_worker_operations o WHERE o.worker_id = w.id AND o.kind = 'drain' AND o.state IN ('pending', 'running'))
		FROM shared_runtime_workers w JOIN shared_runtimes r ON r.id = w.shared_runtime_id
		JOIN app_instances i ON i.id = w.app_instance_id`)
	if err != nil {
		return fmt.Errorf("workers: %w", err)
	}
	var views []workerView
	for rows.Next() {
		var v workerView
		if err := rows.Scan(&v.id, &v.runtime, &v.tenant, &v.project, &v.state, &v.reason, &v.instState, &v.instReason, &v.lastReport, &v.draining); err != nil {
			rows.Close()
			return err
		}
		views = append(views, v)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, v := range views {
		to := workerState(v.instState, v.draining || v.state == WorkerDraining && v.instState != "stopped" && v.instState != "failed")
		reason := v.instReason
		if to == v.state && equalPtr(reason, v.reason) {
			continue
		}
		err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `UPDATE shared_runtime_workers SET state = $2, state_reason = $3, last_report_at = $4, updated_at = $5
				WHERE id = $1 AND state = $6`, v.id, to, clip(reason), v.lastReport, s.Clock.Now(), v.state)
			if err != nil || tag.RowsAffected() == 0 { // another replica applied it
				return err
			}
			meta := map[string]any{"worker_id": v.id.String(), "from": v.state, "to": to}
			if reason != nil {
				meta["reason"] = *clip(reason)
			}
			return s.Audit.Record(ctx, tx, audit.Entry{Action: auditWorkerReport, TargetType: "shared_runtime", TargetID: v.runtime.String(),
				TenantID: v.tenant, ProjectID: v.project, ActorType: audit.ActorSystem, Metadata: meta})
		})
		if err != nil {
			return fmt.Errorf("worker %s: %w", v.id, err)
		}
	}
	return nil
}

func equalPtr(a, b *string) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func clip(s *string) *string {
	if s == nil || len(*s) <= maxStateReason {
		return s
	}
	c := (*s)[:maxStateReason]
	return &c
}

type pendingOp struct {
	Operation
	replaced   uuid.NullUUID
	repair     uuid.NullUUID
	instance   uuid.NullUUID
	instState  *string
	allocation uuid.UUID
	runtime    Runtime
}

func (s *Service) actor(id uuid.UUID) *principal.Principal { return &principal.Principal{UserID: id} }

func (s *Service) finishOp(ctx context.Context, tx pgx.Tx, table string, op Operation, state string, reason *string) error {
	now := s.Clock.Now()
	if _, err := tx.Exec(ctx, `UPDATE `+table+` SET state = $2, state_reason = $3, updated_at = $4, finished_at = $4 WHERE id = $1`,
		op.ID, state, clip(reason), now); err != nil {
		return err
	}
	action := auditWorkerOperation + "." + state
	if table == "shared_runtime_repair_operations" {
		action = auditRepairOperation + "." + state
	}
	meta := map[string]any{"operation_id": op.ID.String(), "kind": op.Kind}
	if reason != nil {
		meta["reason"] = *clip(reason)
	}
	return s.Audit.Record(ctx, tx, audit.Entry{Action: action, TargetType: "shared_runtime", TargetID: op.RuntimeID.String(), ActorType: audit.ActorSystem, Metadata: meta})
}

func (s *Service) advanceWorkerOps(ctx context.Context) error {
	rows, err := s.Pool.Query(ctx, `SELECT o.id, o.shared_runtime_id, o.worker_id, o.kind, o.state, o.state_reason, o.requested_by, o.created_at,
			o.updated_at, o.finished_at, o.replaced_instance_id, o.repair_operation_id, w.app_instance_id, i.state, w.allocation_id
		FROM shared_runtime_worker_operations o JOIN shared_runtime_workers w ON w.id = o.worker_id
		LEFT JOIN app_instances i ON i.id = w.app_instance_id
		WHERE o.state IN ('pending', 'running') ORDER BY o.id`)
	if err != nil {
		return fmt.Errorf("worker operations: %w", err)
	}
	var ops []pendingOp
	for rows.Next() {
		var o pendingOp
		if err := rows.Scan(&o.ID, &o.RuntimeID, &o.WorkerID, &o.Kind, &o.State, &o.StateReason, &o.RequestedBy, &o.CreatedAt, &o.UpdatedAt,
			&o.FinishedAt, &o.replaced, &o.repair, &o.instance, &o.instState, &o.allocation); err != nil {
			rows.Close()
			return err
		}
		ops = append(ops, o)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, o := range ops {
		if err := s.advanceWorkerOp(ctx, o); err != nil {
			s.Log.WarnContext(ctx, "shared runtime worker operation", "operation_id", o.ID, "err", err)
		}
	}
	return nil
}

func ended(state *string) bool { return state == nil || *state == "stopped" || *state == "failed" }

func (s *Service) advanceWorkerOp(ctx context.Context, o pendingOp) error {
	const table = "shared_runtime_worker_operations"
	r, err := s.get(ctx, o.RuntimeID, uuid.Nil)
	if err != nil {
		return err
	}
	owner := projectctx.Project{ID: r.OwnerProjectID, TenantID: r.OwnerTenantID, Role: projectctx.RoleOwner}
	p := s.actor(o.RequestedBy)
	return db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		// The operation's row serialises replicas working on it.
		var state string
		if err := tx.QueryRow(ctx, `SELECT state FROM `+table+` WHERE id = $1 FOR UPDATE`, o.ID).Scan(&state); err != nil || state != o.State {
			return err
		}
		tctx := db.WithTx(ctx, tx)
		switch {
		case o.State == OpPending:
			// Stop the current instance (a restart replaces it; a drain ends it).
			if o.instance.Valid && !ended(o.instState) {
				if err := s.Workers.StopWorker(tctx, p, owner, o.instance.UUID); err != nil {
					reason := "stopping the worker's app instance failed: " + string(apierr.CodeOf(err))
					return s.finishOp(ctx, tx, table, o.Operation, OpFailed, &reason)
				}
			}
			_, err := tx.Exec(ctx, `UPDATE `+table+` SET state = 'running', replaced_instance_id = $2, updated_at = $3 WHERE id = $1`,
				o.ID, o.instance, s.Clock.Now())
			return err
		case o.Kind == OpDrain:
			if ended(o.instState) {
				return s.finishOp(ctx, tx, table, o.Operation, OpSucceeded, nil)
			}
		case o.Kind == OpRestart && o.instance == o.replaced:
			// The old instance must be gone before its allocation gets the new one.
			if !ended(o.instState) {
				return nil
			}
			if err := s.startWorker(tctx, tx, p, owner, r, o.WorkerID, o.allocation, 0); err != nil {
				reason := "starting a new app instance failed: " + string(apierr.CodeOf(err))
				return s.finishOp(ctx, tx, table, o.Operation, OpFailed, &reason)
			}
		case o.Kind == OpRestart && o.instState != nil && *o.instState == "running":
			return s.finishOp(ctx, tx, table, o.Operation, OpSucceeded, nil)
		case o.Kind == OpRestart && ended(o.instState):
			reason := "the new app instance did not start"
			return s.finishOp(ctx, tx, table, o.Operation, OpFailed, &reason)
		}
		return nil
	})
}

func (s *Service) advanceRepairs(ctx context.Context) error {
	const table = "shared_runtime_repair_operations"
	rows, err := s.Pool.Query(ctx, `SELECT `+repairColumns+` FROM `+table+` WHERE state IN ('pending', 'running') ORDER BY id`)
	if err != nil {
		return fmt.Errorf("repairs: %w", err)
	}
	var ops []Operation
	for rows.Next() {
		o, err := scanOp(rows, true)
		if err != nil {
			rows.Close()
			return err
		}
		ops = append(ops, o)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, o := range ops {
		err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
			var state string
			if err := tx.QueryRow(ctx, `SELECT state FROM `+table+` WHERE id = $1 FOR UPDATE`, o.ID).Scan(&state); err != nil || state != o.State {
				return err
			}
			if o.State == OpPending {
				return s.startRepair(ctx, tx, o)
			}
			var open, failed int
			if err := tx.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state IN ('pending', 'running')), count(*) FILTER (WHERE state = 'failed')
				FROM shared_runtime_worker_operations WHERE repair_operation_id = $1`, o.ID).Scan(&open, &failed); err != nil {
				return err
			}
			switch {
			case open > 0:
				return nil
			case failed > 0:
				reason := fmt.Sprintf("%d of %d worker restarts failed", failed, len(o.WorkerIDs))
				return s.finishOp(ctx, tx, table, o, OpFailed, &reason)
			default:
				return s.finishOp(ctx, tx, table, o, OpSucceeded, nil)
			}
		})
		if err != nil {
			s.Log.WarnContext(ctx, "shared runtime repair", "operation_id", o.ID, "err", err)
		}
	}
	return nil
}

// startRepair picks the workers the repair acts on and queues a restart for each.
func (s *Service) startRepair(ctx context.Context, tx pgx.Tx, o Operation) error {
	states := []string{WorkerUnhealthy, WorkerFailed}
	if o.Kind == RepairReplaceFailed {
		states = []string{WorkerFailed}
	}
	rows, err := tx.Query(ctx, `SELECT w.id FROM shared_runtime_workers w WHERE w.shared_runtime_id = $1 AND w.state = ANY($2)
		AND NOT EXISTS (SELECT 1 FROM shared_runtime_worker_operations x WHERE x.worker_id = w.id AND x.state IN ('pending', 'running'))
		ORDER BY w.id`, o.RuntimeID, states)
	if err != nil {
		return err
	}
	var workers []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return err
		}
		workers = append(workers, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, w := range workers {
		op := Operation{ID: s.IDs.New(), RuntimeID: o.RuntimeID, WorkerID: w, Kind: OpRestart, RequestedBy: o.RequestedBy, CreatedAt: s.Clock.Now()}
		if err := insertWorkerOp(ctx, tx, op, o.ID); err != nil {
			return err
		}
	}
	if workers == nil {
		workers = []uuid.UUID{}
	}
	if len(workers) == 0 {
		if _, err := tx.Exec(ctx, `UPDATE shared_runtime_repair_operations SET worker_ids = $2 WHERE id = $1`, o.ID, workers); err != nil {
			return err
		}
		return s.finishOp(ctx, tx, "shared_runtime_repair_operations", o, OpSucceeded, nil)
	}
	_, err = tx.Exec(ctx, `UPDATE shared_runtime_repair_operations SET state = 'running', worker_ids = $2, updated_at = $3 WHERE id = $1`,
		o.ID, workers, s.Clock.Now())
	return err
}
