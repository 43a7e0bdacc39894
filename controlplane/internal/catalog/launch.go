package catalog

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// LaunchTerms is what a launch reads from the catalog: the active SKU and the
// availability state of each of its regions. Unlike an Offer it carries no capacity
// (placement reads the free GPUs itself, under its own rules, and the fleet-wide count an
// Offer shows would cost every launch a read of the whole fleet) and no prices (the launch
// takes its price from billing's runway decision, which resolves the tenant's plan
// already).
type LaunchTerms struct {
	SKU SKU
	// Regions are the SKU's regions in the SKU's order, each with its
	// availability_state (a region that no longer exists reads as disabled, as in an
	// Offer).
	Regions []RegionState
}

// RegionState is one region of a SKU with its availability_state.
type RegionState struct {
	Region string
	State  string
}

// LaunchSKU is the launch terms of SKU id, in one read; an unknown or inactive SKU is
// sku_not_found (as Offer).
func (s *Service) LaunchSKU(ctx context.Context, id string) (LaunchTerms, error) {
	row, err := s.read(ctx).GetSKUForLaunch(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return LaunchTerms{}, skuNotFound(id)
	}
	if err != nil {
		return LaunchTerms{}, fmt.Errorf("load sku: %w", err)
	}
	k := row.CatalogSku
	if !k.Active {
		return LaunchTerms{}, skuNotFound(id)
	}
	if len(row.RegionStates) != len(k.Regions) {
		return LaunchTerms{}, fmt.Errorf("load sku: %d region states for %d regions", len(row.RegionStates), len(k.Regions))
	}
	t := LaunchTerms{SKU: k, Regions: make([]RegionState, 0, len(k.Regions))}
	for i, code := range k.Regions {
		st := row.RegionStates[i]
		if st == "" {
			st = RegionDisabled
		}
		t.Regions = append(t.Regions, RegionState{Region: code, State: st})
	}
	return t, nil
}
