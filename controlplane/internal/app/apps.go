package app

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/sharedruntimes"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// AppInstancesConfig is GANTRY_APP_INSTANCES_* (docs/apps.md).
type AppInstancesConfig struct {
	// MaxPerProject caps a project's live app instances (app_instance_quota_exceeded).
	MaxPerProject int `env:"GANTRY_APP_INSTANCES_MAX_PER_PROJECT" envDefault:"8"`
	// HealthTimeout: an instance not healthy this long fails with a reason.
	HealthTimeout time.Duration `env:"GANTRY_APP_INSTANCES_HEALTH_TIMEOUT" envDefault:"5m"`
	// ReconcileInterval is how often the reconcile pass runs.
	ReconcileInterval time.Duration `env:"GANTRY_APP_INSTANCES_RECONCILE_INTERVAL" envDefault:"2s"`
	// PortBase and PortCount bound the ports given to versions that name none.
	PortBase  int `env:"GANTRY_APP_INSTANCES_PORT_BASE" envDefault:"20000"`
	PortCount int `env:"GANTRY_APP_INSTANCES_PORT_COUNT" envDefault:"10000"`
	// TaskTimeout: a node task not acknowledged by then is given up.
	TaskTimeout time.Duration `env:"GANTRY_APP_INSTANCES_TASK_TIMEOUT" envDefault:"10m"`
	// SharedRuntimeInterval is how often shared runtimes sync their workers, carry
	// operations forward and rate metered calls.
	SharedRuntimeInterval time.Duration `env:"GANTRY_SHARED_RUNTIMES_INTERVAL" envDefault:"2s"`
}

func (c AppInstancesConfig) service() instances.Config {
	return instances.Config{MaxPerProject: c.MaxPerProject, HealthTimeout: c.HealthTimeout, ReconcileInterval: c.ReconcileInterval,
		PortBase: c.PortBase, PortCount: c.PortCount, TaskTimeout: c.TaskTimeout}
}

// runtimeWorkers starts a shared runtime's workers as app instances of its owner
// project (sharedruntimes.Workers over the instances service).
type runtimeWorkers struct{ svc *instances.Service }

func (w runtimeWorkers) StartWorker(ctx context.Context, p *principal.Principal, owner projectctx.Project, spec sharedruntimes.WorkerSpec) (uuid.UUID, uuid.UUID, error) {
	inst, err := w.svc.Launch(ctx, p, owner, instances.LaunchSpec{Name: spec.Name, AppSlug: spec.AppSlug, Version: spec.Version,
		AllocationID: uuid.NullUUID{UUID: spec.AllocationID, Valid: true}})
	if err != nil {
		return uuid.Nil, uuid.Nil, err
	}
	// The instance serves the runtime (AppInstance.shared_runtime_id), in the same
	// transaction as the launch.
	if _, err := db.Querier(ctx, w.svc.Pool).Exec(ctx, `UPDATE app_instances SET shared_runtime_id = $2 WHERE id = $1`, inst.ID, spec.RuntimeID); err != nil {
		return uuid.Nil, uuid.Nil, err
	}
	return inst.ID, inst.NodeID, nil
}

func (w runtimeWorkers) StopWorker(ctx context.Context, p *principal.Principal, owner projectctx.Project, id uuid.UUID) error {
	_, err := w.svc.Stop(ctx, p, owner, id)
	if apierr.CodeOf(err) == apierr.AppInstanceStateInvalid { // already stopping or ended
		return nil
	}
	return err
}

// appTaskResult offers an agent's task result to app instances; handled false when the
// task is not theirs (allocations get it then).
func (a *App) appTaskResult(ctx context.Context, nodeID uuid.UUID, r *fabricv1.TaskResult) (handled bool, err error) {
	if a.Instances == nil {
		return false, nil
	}
	err = a.Instances.TaskResult(ctx, nodeID, r)
	if errors.Is(err, instances.ErrUnknownTask) {
		return false, nil
	}
	return true, err
}
