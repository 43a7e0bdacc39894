package allocations

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/catalog"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
)

// The fleet and the catalog see what live allocations hold through these.
var (
	_ nodes.GPUAllocations = (*Service)(nil)
	_ catalog.SKUUsage     = (*Service)(nil)
)

// AllocatedGPUs implements nodes.GPUAllocations: per node, the GPUs reserved by
// allocations that still hold them (lifecycle.HoldsGPUs).
func (s *Service) AllocatedGPUs(ctx context.Context) (map[uuid.UUID][]string, error) {
	rows, err := s.read(ctx).HeldGPUs(ctx)
	if err != nil {
		return nil, fmt.Errorf("held gpus: %w", err)
	}
	out := map[uuid.UUID][]string{}
	for _, r := range rows {
		out[r.NodeID] = append(out[r.NodeID], r.GpuUuid)
	}
	return out, nil
}

// NodeInUse implements nodes.GPUAllocations.
func (s *Service) NodeInUse(ctx context.Context, nodeID uuid.UUID) (bool, error) {
	used, err := s.read(ctx).NodeInUse(ctx, nodeID)
	if err != nil {
		return false, fmt.Errorf("node in use: %w", err)
	}
	return used, nil
}

// SKUInUse implements catalog.SKUUsage: a live allocation uses the SKU.
func (s *Service) SKUInUse(ctx context.Context, sku string) (bool, error) {
	used, err := s.read(ctx).SKUInUse(ctx, sku)
	if err != nil {
		return false, fmt.Errorf("sku in use: %w", err)
	}
	return used, nil
}
