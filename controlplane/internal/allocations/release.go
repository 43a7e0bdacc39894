package allocations

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/allocationsdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/lifecycle"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Release asks for the allocation to be given back: releasable statuses move to
// releasing (the lifecycle table decides, and its refusals are the answer). The node's
// acknowledgement completes the release (releasing -> released, GPUs freed, billing
// stopped); until the agent reports, the allocation stays releasing and keeps its GPUs.
func (s *Service) Release(ctx context.Context, p *principal.Principal, proj projectctx.Project, id uuid.UUID) (Allocation, error) {
	if !proj.AtLeast(projectctx.RoleMember) {
		// A viewer may read the allocation; say not found only when it is not there.
		if _, err := s.Get(ctx, proj.ID, id); err != nil {
			return Allocation{}, err
		}
		return Allocation{}, apierr.New(apierr.InsufficientPermissions, "viewers cannot release allocations in this project").
			With("required_role", projectctx.RoleMember)
	}
	return s.apply(ctx, id, &proj.ID, lifecycle.Release, Actor{Type: ActorUser, ID: p.UserID.String()}, "released by user")
}

// ReleaseAsSystem releases an allocation of projectID on the platform's own account, for a
// feature that launched it on a user's behalf and whose workload ended without the user
// (an app instance that failed, docs/apps.md): the same move as Release, by ActorSystem.
func (s *Service) ReleaseAsSystem(ctx context.Context, projectID, id uuid.UUID, reason string) (Allocation, error) {
	return s.apply(ctx, id, &projectID, lifecycle.Release, Actor{Type: ActorSystem}, reason)
}

// ForceRelease is the admin's way out of any non-final status: straight to released,
// GPUs freed, billing stopped, and the allocation flagged for node cleanup.
func (s *Service) ForceRelease(ctx context.Context, p *principal.Principal, id uuid.UUID) (Allocation, error) {
	return s.apply(ctx, id, nil, lifecycle.ForceRelease, Actor{Type: ActorAdmin, ID: p.UserID.String()}, "force-released by a platform admin")
}

// apply locks the allocation (of projectID when given) and applies ev in one transaction.
func (s *Service) apply(ctx context.Context, id uuid.UUID, projectID *uuid.UUID, ev lifecycle.Event, actor Actor, reason string) (Allocation, error) {
	a, _, err := s.applyWith(ctx, id, projectID, ev, actor, reason, nil)
	return a, err
}

// applyWith is apply with an extra step inside the transaction after the move (nil: none).
func (s *Service) applyWith(ctx context.Context, id uuid.UUID, projectID *uuid.UUID, ev lifecycle.Event, actor Actor, reason string,
	after func(tx pgx.Tx, a Allocation, out lifecycle.Outcome) error) (Allocation, lifecycle.Outcome, error) {
	var a Allocation
	var out lifecycle.Outcome
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		var err error
		a, err = allocationsdb.New(tx).LockAllocation(ctx, id)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && projectID != nil && a.ProjectID != *projectID) {
			return notFound()
		}
		if err != nil {
			return fmt.Errorf("lock allocation: %w", err)
		}
		if a, out, err = s.transition(ctx, tx, a, ev, actor, reason); err != nil || after == nil {
			return err
		}
		return after(tx, a, out)
	})
	if err != nil {
		return Allocation{}, out, err
	}
	// A node draining may be waiting for this allocation's GPUs.
	if out.Changed && !lifecycle.HoldsGPUs(out.To) {
		s.settleDrain(ctx, a.NodeID)
	}
	return a, out, nil
}

// settleDrain tells a draining node that GPUs of its were freed (Drains); a failure is
// only logged.
func (s *Service) settleDrain(ctx context.Context, nodeID uuid.UUID) {
	if s.Drains == nil {
		return
	}
	if err := s.Drains.SettleDrain(ctx, nodeID); err != nil {
		s.Log.WarnContext(ctx, "settle node drain failed", "node_id", nodeID, "err", err)
	}
}

// AdminList is a page of every tenant's allocations by id, optionally of one tenant
// and one status.
func (s *Service) AdminList(ctx context.Context, tenantID uuid.NullUUID, status *string, afterID uuid.UUID, limit int) (Page[Allocation], error) {
	rows, err := s.read(ctx).ListAllAllocations(ctx, allocationsdb.ListAllAllocationsParams{
		TenantID: tenantID, Status: status, After: after(afterID), Limit: int32(limit + 1),
	})
	if err != nil {
		return Page[Allocation]{}, fmt.Errorf("list allocations: %w", err)
	}
	return page(rows, limit), nil
}
