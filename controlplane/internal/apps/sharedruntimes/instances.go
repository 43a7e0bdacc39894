package sharedruntimes

import (
	"context"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// InstanceWorkers is Workers over the instances service: a worker is an app instance of
// the owner project, launched with every launch check, marked as the runtime's.
type InstanceWorkers struct{ Svc *instances.Service }

// StartWorker launches the worker's instance in the ambient transaction of ctx.
func (w InstanceWorkers) StartWorker(ctx context.Context, p *principal.Principal, owner projectctx.Project, spec WorkerSpec) (uuid.UUID, uuid.UUID, error) {
	inst, err := w.Svc.Launch(ctx, p, owner, instances.LaunchSpec{Name: spec.Name, AppSlug: spec.AppSlug, Version: spec.Version,
		AllocationID: uuid.NullUUID{UUID: spec.AllocationID, Valid: true}})
	if err != nil {
		return uuid.Nil, uuid.Nil, err
	}
	// The instance serves the runtime (AppInstance.shared_runtime_id), written in the
	// launch's transaction.
	if _, err := db.Querier(ctx, w.Svc.Pool).Exec(ctx, `UPDATE app_instances SET shared_runtime_id = $2 WHERE id = $1`, inst.ID, spec.RuntimeID); err != nil {
		return uuid.Nil, uuid.Nil, err
	}
	return inst.ID, inst.NodeID, nil
}

// StopWorker stops a live instance; one already stopping or ended is left as it is.
func (w InstanceWorkers) StopWorker(ctx context.Context, p *principal.Principal, owner projectctx.Project, id uuid.UUID) error {
	_, err := w.Svc.Stop(ctx, p, owner, id)
	if apierr.CodeOf(err) == apierr.AppInstanceStateInvalid {
		return nil
	}
	return err
}
