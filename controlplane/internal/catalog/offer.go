package catalog

import (
	"context"
	"fmt"

	"github.com/cockroachdb/apd/v3"
	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
)

// SecondsPerHour converts a per-GPU-second unit price to an hourly rate.
const SecondsPerHour = 3600

// Offer is an active SKU as the public catalog shows it.
type Offer struct {
	SKU          SKU
	Prices       []OfferPrice
	Availability []RegionAvailability
}

// OfferPrice is the SKU's price in one currency.
type OfferPrice struct {
	Price
	// HourlyMinor is unit price x gpu_count x 3600, rounded once, half away from zero,
	// to minor units (billing's rounding).
	HourlyMinor int64
}

// RegionAvailability is the live capacity of a SKU in one of its regions.
type RegionAvailability struct {
	Region string
	State  string // the region's availability_state
	// FreeGPUs counts free GPUs of the SKU's model on online, schedulable nodes.
	FreeGPUs int
	// Count is how many allocations of the SKU fit now, each on one node (a node with
	// f free GPUs fits f / gpu_count); 0 unless the region is available.
	Count int
}

// Available reports whether at least one allocation fits.
func (a RegionAvailability) Available() bool { return a.Count > 0 }

// HourlyMinor is the hourly rate, in minor units, of gpuCount GPUs at unitPrice (major
// units per GPU-second) in a currency with exponent exp.
func HourlyMinor(unitPrice string, gpuCount int32, exp int) (int64, error) {
	d, _, err := apd.NewFromString(unitPrice)
	if err != nil {
		return 0, fmt.Errorf("unit price %q: %w", unitPrice, err)
	}
	var hourly apd.Decimal
	ctx := apd.BaseContext.WithPrecision(60)
	if _, err := ctx.Mul(&hourly, d, apd.New(int64(gpuCount)*SecondsPerHour, 0)); err != nil {
		return 0, err
	}
	return billing.RoundMinor(&hourly, exp)
}

// offerInputs is what one catalog answer reads once: regions and the fleet's free GPUs.
type offerInputs struct {
	regions map[string]Region
	prices  map[string][]Price
	// free[region][model] lists the free GPU counts of the nodes.
	free map[string]map[string][]int
}

func (s *Service) inputs(ctx context.Context, tenantID uuid.UUID) (offerInputs, error) {
	in := offerInputs{regions: map[string]Region{}, prices: map[string][]Price{}, free: map[string]map[string][]int{}}
	regions, err := s.Regions(ctx)
	if err != nil {
		return in, err
	}
	for _, r := range regions {
		in.regions[r.Code] = r
	}
	if s.Prices != nil {
		if in.prices, err = s.Prices.UnitPrices(ctx, tenantID); err != nil {
			return in, fmt.Errorf("prices: %w", err)
		}
	}
	if s.Fleet == nil {
		return in, nil
	}
	nodes, err := s.Fleet.FreeGPUs(ctx)
	if err != nil {
		return in, fmt.Errorf("free gpus: %w", err)
	}
	for _, n := range nodes {
		if n.Region == "" || n.Free <= 0 {
			continue // a node without a region is in no region's capacity
		}
		if in.free[n.Region] == nil {
			in.free[n.Region] = map[string][]int{}
		}
		in.free[n.Region][n.GPUModel] = append(in.free[n.Region][n.GPUModel], n.Free)
	}
	return in, nil
}

func offer(k SKU, in offerInputs) (Offer, error) {
	o := Offer{SKU: k, Prices: []OfferPrice{}, Availability: []RegionAvailability{}}
	for _, code := range k.Regions {
		a := RegionAvailability{Region: code, State: RegionDisabled}
		if r, ok := in.regions[code]; ok {
			a.State = r.AvailabilityState
		}
		for _, f := range in.free[code][k.GpuModel] {
			a.FreeGPUs += f
			if a.State == RegionAvailable {
				a.Count += f / int(k.GpuCount)
			}
		}
		o.Availability = append(o.Availability, a)
	}
	for _, p := range in.prices[k.UsageUnit] {
		h, err := HourlyMinor(p.UnitPrice, k.GpuCount, p.Exponent)
		if err != nil {
			return o, err
		}
		o.Prices = append(o.Prices, OfferPrice{Price: p, HourlyMinor: h})
	}
	return o, nil
}

// Offers is a page of active SKUs by id, priced for tenantID (uuid.Nil: the default
// plan), with availability.
func (s *Service) Offers(ctx context.Context, tenantID uuid.UUID, after string, limit int) (Page[Offer], error) {
	skus, err := s.ListSKUs(ctx, true, after, limit)
	if err != nil {
		return Page[Offer]{}, err
	}
	out := Page[Offer]{Items: make([]Offer, 0, len(skus.Items)), More: skus.More}
	if len(skus.Items) == 0 {
		return out, nil
	}
	in, err := s.inputs(ctx, tenantID)
	if err != nil {
		return out, err
	}
	for _, k := range skus.Items {
		o, err := offer(k, in)
		if err != nil {
			return out, err
		}
		out.Items = append(out.Items, o)
	}
	return out, nil
}

// Offer is one active SKU; an unknown or inactive one is sku_not_found.
func (s *Service) Offer(ctx context.Context, tenantID uuid.UUID, id string) (Offer, error) {
	k, err := s.GetSKU(ctx, id)
	if err != nil {
		return Offer{}, err
	}
	if !k.Active {
		return Offer{}, skuNotFound(id)
	}
	in, err := s.inputs(ctx, tenantID)
	if err != nil {
		return Offer{}, err
	}
	return offer(k, in)
}
