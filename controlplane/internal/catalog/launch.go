package catalog

import (
	"context"
	"fmt"

	"github.com/google/uuid"
)

// LaunchTerms is what a launch reads from the catalog: the active SKU, its prices in
// force for the tenant, and the availability state of each of its regions. Unlike an
// Offer it carries no capacity: placement reads the free GPUs itself, under its own
// rules, and the fleet-wide count an Offer shows would cost every launch a read of the
// whole fleet.
type LaunchTerms struct {
	SKU    SKU
	Prices []OfferPrice
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

// LaunchTerms is the SKU id for a launch by tenantID; an unknown or inactive SKU is
// sku_not_found (as Offer).
func (s *Service) LaunchTerms(ctx context.Context, tenantID uuid.UUID, id string) (LaunchTerms, error) {
	k, err := s.GetSKU(ctx, id)
	if err != nil {
		return LaunchTerms{}, err
	}
	if !k.Active {
		return LaunchTerms{}, skuNotFound(id)
	}
	regions, err := s.Regions(ctx)
	if err != nil {
		return LaunchTerms{}, err
	}
	state := make(map[string]string, len(regions))
	for _, r := range regions {
		state[r.Code] = r.AvailabilityState
	}
	t := LaunchTerms{SKU: k, Prices: []OfferPrice{}, Regions: make([]RegionState, 0, len(k.Regions))}
	for _, code := range k.Regions {
		st, ok := state[code]
		if !ok {
			st = RegionDisabled
		}
		t.Regions = append(t.Regions, RegionState{Region: code, State: st})
	}
	if s.Prices == nil {
		return t, nil
	}
	prices, err := s.Prices.UnitPrices(ctx, tenantID)
	if err != nil {
		return LaunchTerms{}, fmt.Errorf("prices: %w", err)
	}
	for _, p := range prices[k.UsageUnit] {
		h, err := HourlyMinor(p.UnitPrice, k.GpuCount, p.Exponent)
		if err != nil {
			return LaunchTerms{}, err
		}
		t.Prices = append(t.Prices, OfferPrice{Price: p, HourlyMinor: h})
	}
	return t, nil
}
