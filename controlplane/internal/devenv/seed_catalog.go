package devenv

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/catalog"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// The dev catalog: one region that the dev node lives in, and H100 SKUs that fit on the
// mock DGX H100 (8 GPUs) the dev agent runs on.
const (
	DevRegion   = "dev-local"
	DevSKU      = "h100-80gb-sxm.1x"
	devGPUModel = "NVIDIA H100 80GB HBM3" // what go-nvml's mock DGX H100 reports
)

var devSKUs = []catalog.SKUSpec{
	{ID: DevSKU, GPUModel: devGPUModel, GPUCount: 1, VCPU: 26, MemoryGiB: 225, DiskGiB: 2000, UsageUnit: "gpu.h100", Regions: []string{DevRegion}},
	{ID: "h100-80gb-sxm.2x", GPUModel: devGPUModel, GPUCount: 2, VCPU: 52, MemoryGiB: 450, DiskGiB: 4000, UsageUnit: "gpu.h100", Regions: []string{DevRegion}},
}

// seedCatalog creates the dev region and SKUs when they are missing; it never changes
// ones that exist (an operator may have edited them).
func seedCatalog(ctx context.Context, pool *pgxpool.Pool, in SeedInput, s *Seeded) error {
	svc := catalog.New(pool, in.Clock, in.IDs, nil, nil)
	if _, err := svc.CreateRegion(ctx, catalog.RegionSpec{Code: DevRegion, Label: "Dev (this machine)", IsDefault: true}); err == nil {
		s.Changes = append(s.Changes, "created region "+DevRegion)
	} else if !isConflict(err) {
		return fmt.Errorf("dev region: %w", err)
	}
	for _, spec := range devSKUs {
		if _, err := svc.CreateSKU(ctx, spec); err == nil {
			s.Changes = append(s.Changes, "created SKU "+spec.ID)
		} else if !isConflict(err) {
			return fmt.Errorf("dev SKU %s: %w", spec.ID, err)
		}
	}
	return nil
}

// isConflict: the row exists already (409 of the catalog's create).
func isConflict(err error) bool {
	var e *apierr.Error
	return errors.As(err, &e) && e.HTTPStatus() == 409
}
