package catalog

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/catalog/catalogdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Region is a stored region.
type Region = catalogdb.CatalogRegion

// Region availability states (seed §3).
const (
	RegionAvailable   = "available"
	RegionPlanned     = "planned"
	RegionMaintenance = "maintenance"
	RegionDisabled    = "disabled"
)

// regionRE is the region code nodes carry (nodes.region).
var regionRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)

// RegionSpec is what an admin gives to create a region.
type RegionSpec struct {
	Code              string
	APIRegionCode     *string // default: Code
	Label             string
	IsDefault         bool
	AvailabilityState *string // default: available
	CapacityScopeHint *string
}

// RegionPatch changes some fields of a region; nil leaves a field as it is, an empty
// CapacityScopeHint clears it.
type RegionPatch struct {
	APIRegionCode     *string
	Label             *string
	IsDefault         *bool
	AvailabilityState *string
	CapacityScopeHint *string
}

func regionNotFound() error {
	return apierr.New(apierr.InvalidRequest, "region not found").WithStatus(404).With("reason", "not_found")
}

func checkRegion(code, api, label, state string, hint *string) error {
	switch {
	case !regionRE.MatchString(code):
		return apierr.Validation("code", "code must be lowercase letters, digits and hyphens, 1 to 64 characters").With("reason", "invalid_code")
	case !regionRE.MatchString(api):
		return apierr.Validation("api_region_code", "api_region_code must be lowercase letters, digits and hyphens, 1 to 64 characters").With("reason", "invalid_code")
	case runeLen(label) < 1 || runeLen(label) > 120:
		return apierr.Validation("label", "label has 1 to 120 characters")
	case hint != nil && (runeLen(*hint) < 1 || runeLen(*hint) > 255):
		return apierr.Validation("capacity_scope_hint", "capacity_scope_hint has 1 to 255 characters")
	}
	switch state {
	case RegionAvailable, RegionPlanned, RegionMaintenance, RegionDisabled:
		return nil
	}
	return apierr.Validation("availability_state", "unknown availability_state %q", state)
}

func runeLen(s string) int { return len([]rune(s)) }

func regionMeta(r Region) map[string]any {
	return map[string]any{"availability_state": r.AvailabilityState, "is_default": r.IsDefault, "label": r.Label}
}

// CreateRegion stores a new region; a default region takes the flag from the previous one.
func (s *Service) CreateRegion(ctx context.Context, spec RegionSpec) (Region, error) {
	api, state := spec.Code, RegionAvailable
	if spec.APIRegionCode != nil {
		api = *spec.APIRegionCode
	}
	if spec.AvailabilityState != nil {
		state = *spec.AvailabilityState
	}
	if err := checkRegion(spec.Code, api, spec.Label, state, spec.CapacityScopeHint); err != nil {
		return Region{}, err
	}
	var out Region
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := catalogdb.New(tx)
		now := s.now()
		if spec.IsDefault {
			if err := q.LockDefaultFlag(ctx, "catalog_regions.is_default"); err != nil {
				return fmt.Errorf("lock default flag: %w", err)
			}
			if err := q.ClearDefaultRegion(ctx, catalogdb.ClearDefaultRegionParams{UpdatedAt: now, Code: spec.Code}); err != nil {
				return fmt.Errorf("clear default region: %w", err)
			}
		}
		var err error
		out, err = q.InsertRegion(ctx, catalogdb.InsertRegionParams{
			Code: spec.Code, ApiRegionCode: api, Label: spec.Label, IsDefault: spec.IsDefault,
			AvailabilityState: state, CapacityScopeHint: spec.CapacityScopeHint, CreatedAt: now,
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return apierr.New(apierr.InvalidRequest, "a region with this code exists").WithStatus(409).
				With("reason", "region_exists").With("field", "code")
		}
		if err != nil {
			return fmt.Errorf("insert region: %w", err)
		}
		return s.changed(ctx, tx, "catalog.region.create", "region", out.Code, regionMeta(out))
	})
	return out, err
}

// UpdateRegion applies p; a patch that changes nothing writes nothing.
func (s *Service) UpdateRegion(ctx context.Context, code string, p RegionPatch) (Region, error) {
	var out Region
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := catalogdb.New(tx)
		// The default flag is locked before the row, in the order creates take them.
		if p.IsDefault != nil && *p.IsDefault {
			if err := q.LockDefaultFlag(ctx, "catalog_regions.is_default"); err != nil {
				return fmt.Errorf("lock default flag: %w", err)
			}
		}
		cur, err := q.LockRegion(ctx, code)
		if errors.Is(err, pgx.ErrNoRows) {
			return regionNotFound()
		}
		if err != nil {
			return fmt.Errorf("lock region: %w", err)
		}
		next := cur
		if p.APIRegionCode != nil {
			next.ApiRegionCode = *p.APIRegionCode
		}
		if p.Label != nil {
			next.Label = *p.Label
		}
		if p.IsDefault != nil {
			next.IsDefault = *p.IsDefault
		}
		if p.AvailabilityState != nil {
			next.AvailabilityState = *p.AvailabilityState
		}
		if p.CapacityScopeHint != nil {
			next.CapacityScopeHint = p.CapacityScopeHint
			if *p.CapacityScopeHint == "" {
				next.CapacityScopeHint = nil
			}
		}
		if err := checkRegion(next.Code, next.ApiRegionCode, next.Label, next.AvailabilityState, next.CapacityScopeHint); err != nil {
			return err
		}
		if next.ApiRegionCode == cur.ApiRegionCode && next.Label == cur.Label && next.IsDefault == cur.IsDefault &&
			next.AvailabilityState == cur.AvailabilityState && eqPtr(next.CapacityScopeHint, cur.CapacityScopeHint) {
			out = cur
			return nil
		}
		now := s.now()
		if next.IsDefault && !cur.IsDefault {
			if err := q.ClearDefaultRegion(ctx, catalogdb.ClearDefaultRegionParams{UpdatedAt: now, Code: code}); err != nil {
				return fmt.Errorf("clear default region: %w", err)
			}
		}
		out, err = q.UpdateRegion(ctx, catalogdb.UpdateRegionParams{
			Code: code, ApiRegionCode: next.ApiRegionCode, Label: next.Label, IsDefault: next.IsDefault,
			AvailabilityState: next.AvailabilityState, CapacityScopeHint: next.CapacityScopeHint, UpdatedAt: now,
		})
		if err != nil {
			return fmt.Errorf("update region: %w", err)
		}
		return s.changed(ctx, tx, "catalog.region.update", "region", code, regionMeta(out))
	})
	return out, err
}

// Regions lists every region by code (at most 256, the contract's limit).
func (s *Service) Regions(ctx context.Context) ([]Region, error) {
	rows, err := s.read(ctx).AllRegions(ctx)
	if err != nil {
		return nil, fmt.Errorf("list regions: %w", err)
	}
	if rows == nil {
		rows = []Region{}
	}
	return rows, nil
}

func eqPtr(a, b *string) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}
