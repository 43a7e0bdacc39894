package allocations

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/allocationsdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/lifecycle"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/budgets"
	"github.com/gantry-gpu/gantry/controlplane/internal/catalog"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// launch is what the checks of a launch established, for the transaction that places it.
// A single create is a launch of one member; a group is a launch of count members.
type launch struct {
	sku      catalog.SKU
	region   string // the requested region, "" for any
	members  int
	group    bool
	keyIDs   []uuid.UUID
	pubKeys  []string
	hourly   int64 // the SKU's hourly rate in currency, when priced
	priced   bool
	currency string
	regions  []string // allowed regions, in the catalog's order
}

// checkLaunch runs checks 1 to 5 of docs/allocations.md for members allocations of
// spec.SKU, in that order, before anything is written; checks 6 (the concurrency limit)
// and 7 (capacity) follow in the launch's transaction, under its locks, before it writes
// (lockLaunch). Money and the concurrency limit count every member: the runway and
// budget see members × the SKU's GPUs, the limit members more live allocations.
func (s *Service) checkLaunch(ctx context.Context, p *principal.Principal, proj projectctx.Project, spec CreateSpec, members int, group bool) (launch, error) {
	// 1. The SKU exists and is active.
	terms, err := s.Catalog.LaunchSKU(ctx, spec.SKU)
	if err != nil {
		return launch{}, err
	}
	l := launch{sku: terms.SKU, region: spec.Region, members: members, group: group}
	// 2. The caller may launch here: viewers may not.
	if !proj.AtLeast(projectctx.RoleMember) {
		return launch{}, apierr.New(apierr.InsufficientPermissions, "viewers cannot launch allocations in this project").
			With("required_role", projectctx.RoleMember)
	}
	if spec.Region != "" && !slices.Contains(l.sku.Regions, spec.Region) {
		return launch{}, apierr.Validation("region_code", "%s is not offered in region %s", l.sku.ID, spec.Region).
			With("reason", "region_not_offered")
	}
	if spec.OSImageID.Valid {
		img, err := s.Catalog.GetOSImage(ctx, spec.OSImageID.UUID)
		if err != nil || !img.Active {
			if _, isAPI := apierr.As(err); err != nil && !isAPI {
				return launch{}, err
			}
			return launch{}, apierr.Validation("os_image_id", "OS image not found").With("reason", "os_image_not_found")
		}
	}
	// 3. A resolvable SSH key (422 validation_error when none).
	keys, err := s.Keys.Resolve(ctx, p.UserID, spec.KeyIDs)
	if err != nil {
		return launch{}, err
	}
	l.keyIDs, l.pubKeys = make([]uuid.UUID, 0, len(keys)), make([]string, 0, len(keys))
	for _, k := range keys {
		l.keyIDs = append(l.keyIDs, k.ID)
		l.pubKeys = append(l.pubKeys, k.PublicKey)
	}
	// 4 and 5. Budgets, then the balance runway. The runway decision carries the unit
	// price in force for the tenant, which makes the SKU's hourly rate.
	hourlyIn := func(d billing.Decision) (int64, bool, error) {
		return hourlyRate(d, l.sku.GpuCount)
	}
	if l.currency, l.hourly, l.priced, err = s.affordable(ctx, proj.TenantID, proj.ID, l.sku.UsageUnit, int64(l.sku.GpuCount), "", hourlyIn, members); err != nil {
		return launch{}, err
	}
	l.regions = launchRegions(terms, spec.Region)
	return l, nil
}

// affordable is checks 4 and 5: the budget decision on the launch's cost over the
// minimum runway (members × the hourly rate in the wallet's currency), then the balance
// runway for members × gpus units. The runway decision is read first — it names the
// wallet's currency ("" = the tenant's default), in which the budget estimate is priced
// — but its refusal comes after the budget's, so clients see the documented order.
func (s *Service) affordable(ctx context.Context, tenantID, projectID uuid.UUID, unit string, gpus int64, currency string,
	hourlyIn func(runway billing.Decision) (int64, bool, error), members int) (string, int64, bool, error) {
	runway, err := s.Billing.CanLaunch(ctx, tenantID, projectID, unit, gpus*int64(members), currency)
	if err != nil {
		return "", 0, false, err
	}
	hourly, priced, err := hourlyIn(runway)
	if err != nil {
		return "", 0, false, err
	}
	estimate := int64(0)
	if priced {
		// The launch's cost over the minimum runway, rounded up to whole minor units.
		secs := int64(runway.MinRunway / time.Second)
		estimate = (hourly*int64(members)*secs + 3599) / 3600
	}
	bd, err := s.Budgets.DecideLaunch(ctx, tenantID, projectID, budgets.Money{AmountMinor: estimate, Currency: runway.Currency})
	if err != nil {
		return "", 0, false, err
	}
	if err := bd.Err(); err != nil {
		return "", 0, false, err
	}
	if err := runway.Err(); err != nil {
		return "", 0, false, err
	}
	return runway.Currency, hourly, priced, nil
}

// Placement's reads: a single launch reads the best-fit few nodes (claims that lose a
// race move on to the next of them, then read again); a group reads every candidate.
const (
	singleCandidates = 8
	// maxClaims bounds the claims of one single launch. Every claim that loses means
	// another launch committed a reservation of that GPU, so the loop ends on its own
	// when the fleet fills up; the bound only keeps a transaction that keeps losing
	// (a storm of launches racing for the last GPUs) from holding its locks long. It
	// then answers sku_unavailable, which is what the fleet is about to be.
	maxClaims = 64
)

// lockLaunch is the start of a launch's transaction, checks 6 and 7 under its locks. It
// takes the project's lock and checks the concurrency limit again (creates of one
// project serialize there, so the limit holds under concurrency), then the GPU model's
// lock — shared for a single launch, exclusive for a group — and reads the placement
// candidates: none that fits is sku_unavailable, with nothing written.
//
// Why shared for a single launch: two single launches may place on the same model at
// once; the reservation itself (ClaimGPUs on the partial unique index
// allocation_gpus_held_key) makes sure that no GPU is ever given twice, and a claim that
// loses moves on to another GPU. Each of their claims is one statement on one node in
// uuid order, and a lost multi-GPU claim is rolled back before the next, so two launches
// never wait on each other in a cycle. A group claims node after node while it holds the
// members already placed, which could wait in a cycle with another launch: groups take
// the lock exclusively, so they place alone, on an exact read, and keep their
// all-or-nothing placement by best fit. Lock order is always project, then model.
func (s *Service) lockLaunch(ctx context.Context, tx pgx.Tx, proj projectctx.Project, l launch) ([]nodes.PlacementNode, error) {
	// The locks and the count go in one round trip (the count is its own statement, so
	// it reads after the locks are held).
	p, _ := pipeline(tx)
	q := allocationsdb.New(p)
	if err := q.LockLaunch(ctx, allocationsdb.LockLaunchParams{
		ProjectKey: "allocations/project/" + proj.ID.String(), ModelKey: "allocations/gpu-model/" + l.sku.GpuModel, Exclusive: l.group,
	}); err != nil {
		return nil, fmt.Errorf("lock launch: %w", err)
	}
	// 6. The project's concurrency limit, read after the project's lock.
	live, err := q.CountLiveInProject(ctx, proj.ID)
	if err != nil {
		return nil, fmt.Errorf("count live allocations: %w", err)
	}
	if live+int64(l.members) > int64(s.Config.MaxPerProject) {
		return nil, s.concurrencyLimit()
	}
	// 7. Capacity.
	cands, err := s.candidates(ctx, tx, l, false)
	if err != nil {
		return nil, err
	}
	if len(cands) == 0 {
		return nil, skuUnavailable(l.sku.ID, l.region)
	}
	return cands, nil
}

// candidates reads the placement candidates of l inside tx; a single launch takes this
// replica's hint when it has a young one, unless fresh (hints.go).
func (s *Service) candidates(ctx context.Context, tx pgx.Tx, l launch, fresh bool) ([]nodes.PlacementNode, error) {
	limit, hinted := singleCandidates, !l.group && s.Config.PlacementHintTTL > 0
	if l.group {
		limit = 0
	}
	if hinted && !fresh {
		if cands, ok := s.hints.get(l.hintKey(), s.now(), s.Config.PlacementHintTTL); ok {
			return cands, nil
		}
	}
	cands, err := s.Fleet.PlacementCandidates(db.WithTx(ctx, tx), l.sku.GpuModel, l.regions, int(l.sku.GpuCount), limit)
	if err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	if hinted {
		s.hints.put(l.hintKey(), s.now(), int(l.sku.GpuCount), cands)
	}
	return cands, nil
}

func (l launch) hintKey() string { return hintKey(l.sku.GpuModel, l.regions, int(l.sku.GpuCount)) }

// member is one allocation of a launch to insert.
type member struct {
	name    string
	place   placement
	groupID uuid.NullUUID
}

// insertRequested stores the allocation of a launch as requested on node pl (its GPUs
// are claimed next).
func (s *Service) insertRequested(ctx context.Context, q *allocationsdb.Queries, p *principal.Principal, proj projectctx.Project, l launch, spec CreateSpec, name string, pl placement, groupID uuid.NullUUID, now time.Time) (Allocation, error) {
	params := allocationsdb.InsertAllocationParams{
		ID: s.IDs.New(), TenantID: proj.TenantID, ProjectID: proj.ID, OwnerUserID: p.UserID, Name: name,
		Sku: l.sku.ID, GpuModel: l.sku.GpuModel, GpuCount: l.sku.GpuCount, UsageUnit: l.sku.UsageUnit,
		RegionCode: pl.Region, NodeID: pl.NodeID, OsImageID: spec.OSImageID,
		SshKeyIds: l.keyIDs, SshPublicKeys: l.pubKeys, Status: string(lifecycle.Requested), CreatedAt: now,
		GroupID: groupID,
	}
	if l.priced {
		params.HourlyRateMinor = pgtype.Int8{Int64: l.hourly, Valid: true}
		params.Currency = &l.currency
	}
	a, err := q.InsertAllocation(ctx, params)
	if projectDeleted(err) {
		return Allocation{}, projectGone()
	}
	if err != nil {
		return Allocation{}, fmt.Errorf("insert allocation: %w", err)
	}
	return a, nil
}

// claim reserves gpus of node for allocation id and returns the ones it got (free, of
// model, healthy, on a node online and schedulable).
func claim(ctx context.Context, q *allocationsdb.Queries, id uuid.UUID, node uuid.UUID, model string, gpus []gpuSlot, now time.Time) (map[string]bool, error) {
	gpus = byUUID(gpus)
	params := allocationsdb.ClaimGPUsParams{AllocationID: id, NodeID: node, Model: model, ReservedAt: now,
		GpuUuids: make([]string, len(gpus)), GpuIndexes: make([]int32, len(gpus))}
	for i, g := range gpus {
		params.GpuUuids[i], params.GpuIndexes[i] = g.UUID, g.Index
	}
	got, err := q.ClaimGPUs(ctx, params)
	if err != nil {
		return nil, fmt.Errorf("reserve gpus: %w", err)
	}
	out := make(map[string]bool, len(got))
	for _, u := range got {
		out[u] = true
	}
	return out, nil
}

// placeSingle inserts a single launch's allocation and reserves its GPUs, optimistically:
// it claims the best fit of the candidates read under the launch's locks (cands); a GPU
// another launch reserved meanwhile is dropped from the pool and the next best fit is
// claimed, reading the candidates again when the pool is used up; none left is
// sku_unavailable (the transaction rolls back: nothing persisted). A claim of several
// GPUs runs in a savepoint so that one that got only some of them leaves nothing behind.
func (s *Service) placeSingle(ctx context.Context, tx pgx.Tx, p *principal.Principal, proj projectctx.Project, l launch, spec CreateSpec, name string, cands []nodes.PlacementNode, now time.Time) (Allocation, error) {
	q := allocationsdb.New(tx)
	count, key := int(l.sku.GpuCount), l.hintKey()
	pool := newFreePool(cands)
	var a Allocation
	for range maxClaims {
		i := pool.best(count, "")
		if i < 0 {
			fresh, err := s.candidates(ctx, tx, l, true)
			if err != nil {
				return Allocation{}, err
			}
			if pool = newFreePool(fresh); len(pool.nodes) == 0 {
				return Allocation{}, skuUnavailable(l.sku.ID, l.region)
			}
			continue
		}
		n := pool.nodes[i]
		var err error
		switch {
		case a.ID == uuid.Nil:
			a, err = s.insertRequested(ctx, q, p, proj, l, spec, name, placement{NodeID: n.NodeID, Region: n.Region}, uuid.NullUUID{}, now)
		case a.NodeID != n.NodeID:
			a, err = q.MoveAllocation(ctx, allocationsdb.MoveAllocationParams{ID: a.ID, NodeID: n.NodeID, RegionCode: n.Region})
			if err != nil {
				err = fmt.Errorf("move allocation: %w", err)
			}
		}
		if err != nil {
			return Allocation{}, err
		}
		gpus := pool.pick(i, count)
		s.hints.take(key, n.NodeID, gpus)
		taken, err := claimAll(ctx, tx, a.ID, n.NodeID, l.sku.GpuModel, gpus, now)
		if err != nil {
			return Allocation{}, err
		}
		if len(taken) == 0 {
			return a, nil
		}
		// Taken by launches that committed meanwhile; the rest of the node may still fit.
		pool.remove(i, taken)
	}
	return Allocation{}, skuUnavailable(l.sku.ID, l.region)
}

// claimAll reserves every one of gpus for allocation id, or none: it returns nil when it
// got them all, else the GPUs it found taken (its partial claim rolled back).
func claimAll(ctx context.Context, tx pgx.Tx, id, node uuid.UUID, model string, gpus []gpuSlot, now time.Time) ([]gpuSlot, error) {
	taken := func(got map[string]bool) []gpuSlot {
		var out []gpuSlot
		for _, g := range gpus {
			if !got[g.UUID] {
				out = append(out, g)
			}
		}
		return out
	}
	if len(gpus) == 1 {
		// One row: it is reserved or it is not, nothing to undo.
		got, err := claim(ctx, allocationsdb.New(tx), id, node, model, gpus, now)
		if err != nil {
			return nil, err
		}
		return taken(got), nil
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("savepoint: %w", err)
	}
	got, err := claim(ctx, allocationsdb.New(sp), id, node, model, gpus, now)
	if err == nil && len(got) == len(gpus) {
		if err := sp.Commit(ctx); err != nil {
			return nil, fmt.Errorf("release savepoint: %w", err)
		}
		return nil, nil
	}
	if rbErr := sp.Rollback(ctx); rbErr != nil && err == nil {
		err = fmt.Errorf("rollback savepoint: %w", rbErr)
	}
	if err != nil {
		return nil, err
	}
	return taken(got), nil
}

// insertMember stores one group member placed under the exclusive lock: the allocation
// as requested with its GPUs. Its GPUs cannot be taken meanwhile (every launch of the
// model waits for the group), so a claim that does not get them all is a bug the unique
// index caught: sku_unavailable, and the group rolls back whole.
func (s *Service) insertMember(ctx context.Context, tx pgx.Tx, p *principal.Principal, proj projectctx.Project, l launch, spec CreateSpec, m member, now time.Time) (Allocation, error) {
	q := allocationsdb.New(tx)
	a, err := s.insertRequested(ctx, q, p, proj, l, spec, m.name, m.place, m.groupID, now)
	if err != nil {
		return Allocation{}, err
	}
	got, err := claim(ctx, q, a.ID, m.place.NodeID, l.sku.GpuModel, m.place.GPUs, now)
	if err != nil {
		return Allocation{}, err
	}
	if len(got) != len(m.place.GPUs) {
		return Allocation{}, skuUnavailable(l.sku.ID, l.region)
	}
	return a, s.recordCreated(ctx, tx, a, p, m.groupID)
}

// recordCreated writes a new allocation's status event, task, outbox events and audit
// row.
func (s *Service) recordCreated(ctx context.Context, tx pgx.Tx, a Allocation, p *principal.Principal, groupID uuid.NullUUID) error {
	reason := ""
	if groupID.Valid {
		reason = "launched in group " + groupID.UUID.String()
	}
	return s.recorded(ctx, tx, a, nil, "create", "allocation.create", Actor{Type: ActorUser, ID: p.UserID.String()}, reason)
}
