package instances

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/proxy"
)

// ProxyTarget is where the app proxy reaches an instance (proxy.Instances): any
// project's instance, since the proxy decides access itself (other tenants get 404
// there). An instance whose command or environment names {base_path} serves under its
// proxy path, so the proxy keeps the prefix.
func (s *Service) ProxyTarget(ctx context.Context, id uuid.UUID) (proxy.Target, error) {
	i, err := scanInstance(s.q(ctx).QueryRow(ctx, `SELECT `+instanceColumns+` FROM app_instances WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return proxy.Target{}, notFound()
	}
	if err != nil {
		return proxy.Target{}, fmt.Errorf("load app instance: %w", err)
	}
	return proxy.Target{
		InstanceID: i.ID, TenantID: i.TenantID, ProjectID: i.ProjectID, AllocationID: i.AllocationID, NodeID: i.NodeID,
		Port: i.Port, State: string(i.State), KeepPrefix: keepsPrefix(i.RunSpec),
	}, nil
}

func keepsPrefix(runSpec json.RawMessage) bool {
	var spec RunSpec
	if json.Unmarshal(runSpec, &spec) != nil {
		return false
	}
	for _, a := range spec.Command {
		if strings.Contains(a, "{base_path}") {
			return true
		}
	}
	for _, v := range spec.Env {
		if strings.Contains(v, "{base_path}") {
			return true
		}
	}
	return false
}
