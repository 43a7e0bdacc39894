package instances

import (
	"context"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps"
)

// AppsCatalog is Catalog over the app catalog (apps.Service.LaunchVersion, which
// decides app_not_found, app_version_not_found and app_not_entitled).
type AppsCatalog struct{ Apps *apps.Service }

// LaunchVersion implements Catalog.
func (c AppsCatalog) LaunchVersion(ctx context.Context, tenantID uuid.UUID, slug, version string) (Version, error) {
	l, err := c.Apps.LaunchVersion(ctx, tenantID, slug, version)
	if err != nil {
		return Version{}, err
	}
	env := make(map[string]string, len(l.Env))
	for _, e := range l.Env {
		env[e.Name] = e.Value
	}
	return Version{
		AppSlug: l.AppSlug, AppName: l.AppName, Kind: l.Kind, Version: l.Version.Version,
		Command: l.Command, Env: env, Port: l.Port,
		Health: HealthCheck{Type: l.Health.Type, Path: l.Health.Path, IntervalSeconds: l.Health.IntervalSeconds,
			TimeoutSeconds: l.Health.TimeoutSeconds, FailureThreshold: l.Health.FailureThreshold,
			StartupTimeoutSeconds: l.Health.StartupTimeoutSeconds},
		MinGPUs: l.MinGPUCount, GPUModel: l.GPUModel, WholeAllocation: l.Placement == apps.PlacementWholeAllocation,
		BootstrapSSH: l.BootstrapSSH,
	}, nil
}
