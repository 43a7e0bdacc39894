package proxy

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// DBInstances reads proxy targets from the instances feature's table (app_instances,
// migration 00820): one indexed read per request, no lock, nothing written. The proxy
// needs nothing the instances service computes, only where the instance is and whether
// it runs; the row is what the instances service last persisted.
type DBInstances struct {
	Pool *pgxpool.Pool
}

// ProxyTarget implements Instances.
func (d DBInstances) ProxyTarget(ctx context.Context, id uuid.UUID) (Target, error) {
	t := Target{InstanceID: id}
	var spec string
	err := db.Querier(ctx, d.Pool).QueryRow(ctx, `
SELECT tenant_id, project_id, allocation_id, node_id, port, state, run_spec::text
FROM app_instances WHERE id = $1`, id).Scan(&t.TenantID, &t.ProjectID, &t.AllocationID, &t.NodeID, &t.Port, &t.State, &spec)
	if errors.Is(err, pgx.ErrNoRows) {
		return Target{}, apierr.New(apierr.AppInstanceNotFound, "app instance not found")
	}
	if err != nil {
		return Target{}, fmt.Errorf("app proxy: read instance: %w", err)
	}
	t.KeepPrefix = UsesProxyPath(spec)
	return t, nil
}

// UsesProxyPath reports whether a run spec (its JSON, or a command line) hands the app
// its proxy path (the {base_path} placeholder, proto/fabric/apptask): such an app serves under
// the path and gets requests with it; any other app gets them with the prefix removed.
func UsesProxyPath(spec string) bool {
	return strings.Contains(spec, "{base_path}")
}
