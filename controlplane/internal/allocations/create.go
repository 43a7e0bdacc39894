package allocations

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/allocationsdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/lifecycle"
	"github.com/gantry-gpu/gantry/controlplane/internal/budgets"
	"github.com/gantry-gpu/gantry/controlplane/internal/catalog"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// CreateSpec is what a launch asks for.
type CreateSpec struct {
	Name      string
	SKU       string
	Region    string      // "" = any available region of the SKU
	KeyIDs    []uuid.UUID // empty = every key of the caller
	OSImageID uuid.NullUUID
}

// Limits of the request fields (the contract says the same).
const (
	maxNameLen = 120
	maxKeys    = 32
)

func skuUnavailable(sku, region string) error {
	e := apierr.New(apierr.SKUUnavailable, "no capacity for %s right now", sku).With("sku", sku)
	if region != "" {
		e.With("region_code", region)
	}
	return e
}

// Create launches an allocation. Every check runs before anything is written, in the
// order of docs/allocations.md; a refusal leaves no row, event or audit entry. Then one
// transaction re-checks the concurrency limit and the capacity under locks, reserves
// the GPUs and stores the allocation as requested with its status event, outbox event
// and audit row.
func (s *Service) Create(ctx context.Context, p *principal.Principal, proj projectctx.Project, spec CreateSpec) (Allocation, error) {
	name := strings.TrimSpace(spec.Name)
	if name == "" || len([]rune(spec.Name)) > maxNameLen {
		return Allocation{}, apierr.Validation("name", "name must be 1..%d characters and not blank", maxNameLen).With("reason", "length")
	}
	if len(spec.KeyIDs) > maxKeys {
		return Allocation{}, apierr.Validation("ssh_key_ids", "at most %d SSH keys", maxKeys).With("reason", "too_many")
	}

	// 1. The SKU exists and is active.
	offer, err := s.Catalog.Offer(ctx, proj.TenantID, spec.SKU)
	if err != nil {
		return Allocation{}, err
	}
	sku := offer.SKU
	// 2. The caller may launch here: viewers may not.
	if !proj.AtLeast(projectctx.RoleMember) {
		return Allocation{}, apierr.New(apierr.InsufficientPermissions, "viewers cannot launch allocations in this project").
			With("required_role", projectctx.RoleMember)
	}
	if spec.Region != "" && !slices.Contains(sku.Regions, spec.Region) {
		return Allocation{}, apierr.Validation("region_code", "%s is not offered in region %s", sku.ID, spec.Region).
			With("reason", "region_not_offered")
	}
	if spec.OSImageID.Valid {
		img, err := s.Catalog.GetOSImage(ctx, spec.OSImageID.UUID)
		if err != nil || !img.Active {
			if _, isAPI := apierr.As(err); err != nil && !isAPI {
				return Allocation{}, err
			}
			return Allocation{}, apierr.Validation("os_image_id", "OS image not found").With("reason", "os_image_not_found")
		}
	}
	// 3. A resolvable SSH key (422 validation_error when none).
	keys, err := s.Keys.Resolve(ctx, p.UserID, spec.KeyIDs)
	if err != nil {
		return Allocation{}, err
	}
	// 4 and 5. Budgets, then the balance runway. The runway decision is read first: it
	// names the tenant's currency, in which the budget estimate is priced.
	runway, err := s.Billing.CanLaunch(ctx, proj.TenantID, proj.ID, sku.UsageUnit, int64(sku.GpuCount), "")
	if err != nil {
		return Allocation{}, err
	}
	hourly, priced := hourlyRate(offer, runway.Currency)
	estimate := int64(0)
	if priced {
		// The launch's cost over the minimum runway, rounded up to whole minor units.
		secs := int64(runway.MinRunway / time.Second)
		estimate = (hourly*secs + 3599) / 3600
	}
	bd, err := s.Budgets.DecideLaunch(ctx, proj.TenantID, proj.ID, budgets.Money{AmountMinor: estimate, Currency: runway.Currency})
	if err != nil {
		return Allocation{}, err
	}
	if err := bd.Err(); err != nil {
		return Allocation{}, err
	}
	if err := runway.Err(); err != nil {
		return Allocation{}, err
	}
	// 6. The project's concurrency limit.
	live, err := s.read(ctx).CountLiveInProject(ctx, proj.ID)
	if err != nil {
		return Allocation{}, fmt.Errorf("count live allocations: %w", err)
	}
	if live >= int64(s.Config.MaxPerProject) {
		return Allocation{}, s.concurrencyLimit()
	}
	// 7. Capacity.
	regions := launchRegions(offer, spec.Region)
	cands, err := s.candidates(ctx, sku.GpuModel, int(sku.GpuCount), regions)
	if err != nil {
		return Allocation{}, err
	}
	if len(cands) == 0 {
		return Allocation{}, skuUnavailable(sku.ID, spec.Region)
	}

	keyIDs := make([]uuid.UUID, 0, len(keys))
	pubKeys := make([]string, 0, len(keys))
	for _, k := range keys {
		keyIDs = append(keyIDs, k.ID)
		pubKeys = append(pubKeys, k.PublicKey)
	}
	var a Allocation
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := allocationsdb.New(tx)
		// Creates of one project serialize here so the limit holds under concurrency.
		if err := q.LockKey(ctx, "allocations/project/"+proj.ID.String()); err != nil {
			return fmt.Errorf("lock project: %w", err)
		}
		live, err := q.CountLiveInProject(ctx, proj.ID)
		if err != nil {
			return fmt.Errorf("count live allocations: %w", err)
		}
		if live >= int64(s.Config.MaxPerProject) {
			return s.concurrencyLimit()
		}
		// Placements of one GPU model serialize here: what is held is read under the
		// lock, so two creates never pick the same GPU (the unique index stands behind).
		if err := q.LockKey(ctx, "allocations/gpu-model/"+sku.GpuModel); err != nil {
			return fmt.Errorf("lock gpu model: %w", err)
		}
		pl, ok, err := place(ctx, q, cands, int(sku.GpuCount))
		if err != nil {
			return err
		}
		if !ok {
			return skuUnavailable(sku.ID, spec.Region)
		}
		now := s.now()
		params := allocationsdb.InsertAllocationParams{
			ID: s.IDs.New(), TenantID: proj.TenantID, ProjectID: proj.ID, OwnerUserID: p.UserID, Name: name,
			Sku: sku.ID, GpuModel: sku.GpuModel, GpuCount: sku.GpuCount, UsageUnit: sku.UsageUnit,
			RegionCode: pl.Region, NodeID: pl.NodeID, OsImageID: spec.OSImageID,
			SshKeyIds: keyIDs, SshPublicKeys: pubKeys, Status: string(lifecycle.Requested), CreatedAt: now,
		}
		if priced {
			params.HourlyRateMinor = pgtype.Int8{Int64: hourly, Valid: true}
			params.Currency = &runway.Currency
		}
		if a, err = q.InsertAllocation(ctx, params); err != nil {
			return fmt.Errorf("insert allocation: %w", err)
		}
		for _, g := range pl.GPUs {
			if err := q.InsertGPU(ctx, allocationsdb.InsertGPUParams{
				AllocationID: a.ID, NodeID: pl.NodeID, GpuUuid: g.UUID, GpuIndex: g.Index, ReservedAt: now,
			}); err != nil {
				if db.IsUniqueViolation(err, "allocation_gpus_held_key") {
					return skuUnavailable(sku.ID, spec.Region)
				}
				return fmt.Errorf("reserve gpu: %w", err)
			}
		}
		return s.recorded(ctx, tx, a, nil, "create", "allocation.create", Actor{Type: ActorUser, ID: p.UserID.String()}, "")
	})
	if err != nil {
		return Allocation{}, err
	}
	return a, nil
}

func (s *Service) concurrencyLimit() error {
	return apierr.New(apierr.AllocationConcurrencyLimit, "the project already has %d live allocations", s.Config.MaxPerProject).
		With("limit", s.Config.MaxPerProject)
}

// launchRegions are the regions a launch may be placed in: the requested one, else
// every region of the SKU; only regions whose state is available.
func launchRegions(o catalog.Offer, requested string) []string {
	var out []string
	for _, av := range o.Availability {
		if av.State != "available" || (requested != "" && av.Region != requested) {
			continue
		}
		out = append(out, av.Region)
	}
	return out
}

// hourlyRate is the SKU's hourly rate in currency under the plan in force, if priced.
func hourlyRate(o catalog.Offer, currency string) (int64, bool) {
	for _, p := range o.Prices {
		if p.Currency == currency {
			return p.HourlyMinor, true
		}
	}
	return 0, false
}
