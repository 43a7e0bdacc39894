package app

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
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
