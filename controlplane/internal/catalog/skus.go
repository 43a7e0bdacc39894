package catalog

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/catalog/catalogdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// SKU is a stored SKU.
type SKU = catalogdb.CatalogSku

// Limits of a SKU (the contract says the same).
const (
	MaxSKUIDLen    = 64
	MinGPUCount    = 1
	MaxGPUCount    = 16
	MaxVCPU        = 1024
	MaxMemoryGiB   = 65536
	MaxDiskGiB     = 1048576
	MaxSKURegions  = 64
	MaxGPUModelLen = 128
)

var (
	// skuIDRE: a shape name of lowercase letters, digits and inner hyphens, a dot, then
	// the GPU count and "x": h100-80gb-sxm.1x, a100-40gb-pcie.8x.
	skuIDRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?\.[1-9][0-9]?x$`)
	// unitRE is billing's usage-unit pattern (billing_prices.usage_unit).
	unitRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._:-]{0,63}$`)
)

// SKUSpec is what an admin gives to create a SKU.
type SKUSpec struct {
	ID          string
	DisplayName *string // default: ID
	GPUModel    string
	GPUCount    int
	VCPU        int
	MemoryGiB   int
	DiskGiB     int
	UsageUnit   string
	Regions     []string
	Active      *bool // default: true
}

// SKUPatch changes some fields of a SKU; nil leaves a field as it is. The GPU model and
// count are part of what the id names and never change.
type SKUPatch struct {
	DisplayName *string
	VCPU        *int
	MemoryGiB   *int
	DiskGiB     *int
	UsageUnit   *string
	Regions     *[]string
	Active      *bool
}

func skuNotFound(id string) error {
	return apierr.New(apierr.SKUNotFound, "SKU not found").With("sku", truncate(id, MaxSKUIDLen))
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func checkSKUID(id string, gpuCount int) error {
	if len(id) > MaxSKUIDLen || !skuIDRE.MatchString(id) {
		return apierr.Validation("id", "id must look like h100-80gb-sxm.1x: lowercase letters, digits and inner hyphens, a dot, the GPU count and x; at most %d characters", MaxSKUIDLen).
			With("reason", "invalid_sku_id")
	}
	n, _ := strconv.Atoi(id[strings.LastIndexByte(id, '.')+1 : len(id)-1])
	if n != gpuCount {
		return apierr.Validation("id", "the id names %d GPUs but gpu_count is %d", n, gpuCount).With("reason", "gpu_count_mismatch")
	}
	return nil
}

func between(field string, v, lo, hi int) error {
	if v < lo || v > hi {
		return apierr.Validation(field, "%s must be between %d and %d", field, lo, hi).With("reason", "out_of_range")
	}
	return nil
}

// checkShape validates everything but the id.
func checkShape(sku SKU) error {
	if n := runeLen(sku.DisplayName); n < 1 || n > 120 {
		return apierr.Validation("display_name", "display_name has 1 to 120 characters")
	}
	if n := runeLen(sku.GpuModel); n < 1 || n > MaxGPUModelLen || strings.TrimSpace(sku.GpuModel) != sku.GpuModel {
		return apierr.Validation("gpu_model", "gpu_model is the model as nodes report it (1 to %d characters, no surrounding spaces)", MaxGPUModelLen)
	}
	for _, c := range []struct {
		field     string
		v, lo, hi int
	}{
		{"gpu_count", int(sku.GpuCount), MinGPUCount, MaxGPUCount},
		{"vcpu", int(sku.Vcpu), 1, MaxVCPU},
		{"memory_gib", int(sku.MemoryGib), 1, MaxMemoryGiB},
		{"disk_gib", int(sku.DiskGib), 1, MaxDiskGiB},
	} {
		if err := between(c.field, c.v, c.lo, c.hi); err != nil {
			return err
		}
	}
	if !unitRE.MatchString(sku.UsageUnit) {
		return apierr.Validation("usage_unit", "usage_unit must match %s", unitRE).With("reason", "malformed_unit")
	}
	if len(sku.Regions) > MaxSKURegions {
		return apierr.Validation("regions", "at most %d regions", MaxSKURegions)
	}
	for i, r := range sku.Regions {
		if !regionRE.MatchString(r) {
			return apierr.Validation(fmt.Sprintf("regions[%d]", i), "not a region code").With("reason", "invalid_code")
		}
	}
	return nil
}

// normRegions sorts and dedupes region codes (a set).
func normRegions(in []string) []string {
	out := slices.Clone(in)
	if out == nil {
		out = []string{}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// checkRegionsExist refuses codes that are not regions. Regions are never deleted, so
// the check holds after commit.
func checkRegionsExist(ctx context.Context, q *catalogdb.Queries, codes []string) error {
	if len(codes) == 0 {
		return nil
	}
	n, err := q.CountRegions(ctx, codes)
	if err != nil {
		return fmt.Errorf("count regions: %w", err)
	}
	if int(n) == len(codes) {
		return nil
	}
	rows, err := q.AllRegions(ctx)
	if err != nil {
		return fmt.Errorf("list regions: %w", err)
	}
	var unknown []string
	for _, c := range codes {
		if !slices.ContainsFunc(rows, func(r Region) bool { return r.Code == c }) {
			unknown = append(unknown, c)
		}
	}
	return apierr.Validation("regions", "unknown region %s", strings.Join(unknown, ", ")).
		With("reason", "unknown_region").With("regions", unknown)
}

func skuMeta(k SKU) map[string]any {
	return map[string]any{
		"gpu_model": k.GpuModel, "gpu_count": k.GpuCount, "usage_unit": k.UsageUnit,
		"regions": k.Regions, "active": k.Active,
	}
}

// CreateSKU validates spec and stores it.
func (s *Service) CreateSKU(ctx context.Context, spec SKUSpec) (SKU, error) {
	if err := checkSKUID(spec.ID, spec.GPUCount); err != nil {
		return SKU{}, err
	}
	in := SKU{
		ID: spec.ID, DisplayName: spec.ID, GpuModel: spec.GPUModel, GpuCount: int32(spec.GPUCount),
		Vcpu: int32(spec.VCPU), MemoryGib: int32(spec.MemoryGiB), DiskGib: int32(spec.DiskGiB),
		UsageUnit: spec.UsageUnit, Regions: normRegions(spec.Regions), Active: true,
	}
	if spec.DisplayName != nil {
		in.DisplayName = *spec.DisplayName
	}
	if spec.Active != nil {
		in.Active = *spec.Active
	}
	// Range-check before the int32 conversions above can have wrapped anything.
	for _, c := range []struct {
		field string
		v, hi int
	}{{"gpu_count", spec.GPUCount, MaxGPUCount}, {"vcpu", spec.VCPU, MaxVCPU}, {"memory_gib", spec.MemoryGiB, MaxMemoryGiB}, {"disk_gib", spec.DiskGiB, MaxDiskGiB}} {
		if err := between(c.field, c.v, 1, c.hi); err != nil {
			return SKU{}, err
		}
	}
	if err := checkShape(in); err != nil {
		return SKU{}, err
	}
	var out SKU
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := catalogdb.New(tx)
		if err := checkRegionsExist(ctx, q, in.Regions); err != nil {
			return err
		}
		var err error
		out, err = q.InsertSKU(ctx, catalogdb.InsertSKUParams{
			ID: in.ID, DisplayName: in.DisplayName, GpuModel: in.GpuModel, GpuCount: in.GpuCount, Vcpu: in.Vcpu,
			MemoryGib: in.MemoryGib, DiskGib: in.DiskGib, UsageUnit: in.UsageUnit, Regions: in.Regions,
			Active: in.Active, CreatedAt: s.now(),
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return apierr.New(apierr.InvalidRequest, "a SKU with this id exists").WithStatus(409).
				With("reason", "sku_exists").With("field", "id")
		}
		if err != nil {
			return fmt.Errorf("insert sku: %w", err)
		}
		return s.changed(ctx, tx, "catalog.sku.create", "sku", out.ID, skuMeta(out))
	})
	return out, err
}

// GetSKU loads a SKU, active or not.
func (s *Service) GetSKU(ctx context.Context, id string) (SKU, error) {
	k, err := s.read(ctx).GetSKU(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return SKU{}, skuNotFound(id)
	}
	if err != nil {
		return SKU{}, fmt.Errorf("load sku: %w", err)
	}
	return k, nil
}

// ListSKUs is a page of SKUs by id after after ("" for the first page).
func (s *Service) ListSKUs(ctx context.Context, activeOnly bool, after string, limit int) (Page[SKU], error) {
	var a *string
	if after != "" {
		a = &after
	}
	rows, err := s.read(ctx).ListSKUs(ctx, catalogdb.ListSKUsParams{Limit: int32(limit + 1), After: a, ActiveOnly: activeOnly})
	if err != nil {
		return Page[SKU]{}, fmt.Errorf("list skus: %w", err)
	}
	return page(rows, limit), nil
}

// UpdateSKU applies p; a patch that changes nothing writes nothing.
func (s *Service) UpdateSKU(ctx context.Context, id string, p SKUPatch) (SKU, error) {
	for _, c := range []struct {
		field string
		v     *int
		hi    int
	}{{"vcpu", p.VCPU, MaxVCPU}, {"memory_gib", p.MemoryGiB, MaxMemoryGiB}, {"disk_gib", p.DiskGiB, MaxDiskGiB}} {
		if c.v != nil {
			if err := between(c.field, *c.v, 1, c.hi); err != nil {
				return SKU{}, err
			}
		}
	}
	var out SKU
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := catalogdb.New(tx)
		cur, err := q.LockSKU(ctx, id)
		if errors.Is(err, pgx.ErrNoRows) {
			return skuNotFound(id)
		}
		if err != nil {
			return fmt.Errorf("lock sku: %w", err)
		}
		next := cur
		if p.DisplayName != nil {
			next.DisplayName = *p.DisplayName
		}
		if p.VCPU != nil {
			next.Vcpu = int32(*p.VCPU)
		}
		if p.MemoryGiB != nil {
			next.MemoryGib = int32(*p.MemoryGiB)
		}
		if p.DiskGiB != nil {
			next.DiskGib = int32(*p.DiskGiB)
		}
		if p.UsageUnit != nil {
			next.UsageUnit = *p.UsageUnit
		}
		if p.Regions != nil {
			next.Regions = normRegions(*p.Regions)
		}
		if p.Active != nil {
			next.Active = *p.Active
		}
		if err := checkShape(next); err != nil {
			return err
		}
		if next.DisplayName == cur.DisplayName && next.Vcpu == cur.Vcpu && next.MemoryGib == cur.MemoryGib &&
			next.DiskGib == cur.DiskGib && next.UsageUnit == cur.UsageUnit && slices.Equal(next.Regions, cur.Regions) &&
			next.Active == cur.Active {
			out = cur
			return nil
		}
		if err := checkRegionsExist(ctx, q, next.Regions); err != nil {
			return err
		}
		out, err = q.UpdateSKU(ctx, catalogdb.UpdateSKUParams{
			ID: id, DisplayName: next.DisplayName, Vcpu: next.Vcpu, MemoryGib: next.MemoryGib, DiskGib: next.DiskGib,
			UsageUnit: next.UsageUnit, Regions: next.Regions, Active: next.Active, UpdatedAt: s.now(),
		})
		if err != nil {
			return fmt.Errorf("update sku: %w", err)
		}
		return s.changed(ctx, tx, "catalog.sku.update", "sku", id, skuMeta(out))
	})
	return out, err
}

// DeleteSKU removes a SKU that no live allocation uses.
func (s *Service) DeleteSKU(ctx context.Context, id string) error {
	return db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := catalogdb.New(tx)
		cur, err := q.LockSKU(ctx, id)
		if errors.Is(err, pgx.ErrNoRows) {
			return skuNotFound(id)
		}
		if err != nil {
			return fmt.Errorf("lock sku: %w", err)
		}
		inUse, err := s.Usage.SKUInUse(db.WithTx(ctx, tx), id)
		if err != nil {
			return fmt.Errorf("sku in use: %w", err)
		}
		if inUse {
			return apierr.New(apierr.InvalidRequest, "live allocations use this SKU; deactivate it instead").WithStatus(409).
				With("reason", "sku_in_use")
		}
		if _, err := q.DeleteSKU(ctx, id); err != nil {
			return fmt.Errorf("delete sku: %w", err)
		}
		return s.changed(ctx, tx, "catalog.sku.delete", "sku", id, skuMeta(cur))
	})
}
