package allocations

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/allocationsdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/lifecycle"
	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Group is an allocation group row.
type Group = allocationsdb.AllocationGroup

// GroupView is a group with its members (by id).
type GroupView struct {
	Group
	Members []Allocation
}

// Limits of a group launch (the contract says the same).
const (
	// MaxGroupMembers bounds count: a gang larger than the biggest training jobs we
	// expect would hold one transaction (and the GPU model's lock) for too long.
	MaxGroupMembers = 64
	// maxGroupNameLen leaves room for the members' "-<n>" suffix within maxNameLen.
	maxGroupNameLen = 100
)

// Group events (outbox, subjects gantry.events.<type>).
const (
	EventGroupCreated  = "allocation_group.created"
	EventGroupReleased = "allocation_group.releasing"
)

func groupNotFound() error {
	// The contract has no code of its own for groups; a group is a set of allocations,
	// and one of another project must not be revealed either.
	return apierr.NotFound(apierr.AllocationNotFound, "allocation group")
}

// CreateGroup launches count allocations of one SKU, all or nothing. The checks of a
// single launch run in the same order for the whole group (checkLaunch, then lockLaunch
// in the transaction: money for count × the SKU's GPUs, the concurrency limit counting
// count allocations, capacity for every member in one region); a refusal writes
// nothing. ONE transaction places every member under the project's lock and the GPU
// model's exclusive lock (on an exact read: no other launch of the model is placing),
// inserts the group, its members as requested (each with its GPUs, status event, task,
// outbox event and audit row), the group's outbox event and its audit row. If any member
// does not fit, the whole transaction rolls back: sku_unavailable, nothing persisted.
// storage_attachments are checked and authorised once after checkLaunch, as for a
// single launch (a refusal creates nothing), and recorded for every member in that
// transaction: each member has its own attachments, started when it becomes active.
func (s *Service) CreateGroup(ctx context.Context, p *principal.Principal, proj projectctx.Project, spec CreateSpec, count int) (GroupView, error) {
	name, err := checkName(spec, maxGroupNameLen)
	if err != nil {
		return GroupView{}, err
	}
	if count < 1 || count > MaxGroupMembers {
		return GroupView{}, apierr.Validation("count", "count must be 1..%d", MaxGroupMembers).With("reason", "out_of_range")
	}
	l, err := s.checkLaunch(ctx, p, proj, spec, count, true)
	if err != nil {
		return GroupView{}, err
	}
	// The storage attachments are checked and authorised once, as for a single launch,
	// before anything is written; every member gets its own copy of them below.
	recordAttachments, err := s.prepareAttachments(ctx, p, proj, spec.Attachments)
	if err != nil {
		return GroupView{}, err
	}
	var out GroupView
	err = inLaunchTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := allocationsdb.New(tx)
		cands, err := s.lockLaunch(ctx, tx, proj, l)
		if err != nil {
			return err
		}
		pls, ok := placeMembers(cands, l.regions, int(l.sku.GpuCount), count)
		if !ok {
			return skuUnavailable(l.sku.ID, l.region)
		}
		now := s.now()
		g, err := q.InsertGroup(ctx, allocationsdb.InsertGroupParams{
			ID: s.IDs.New(), TenantID: proj.TenantID, ProjectID: proj.ID, OwnerUserID: p.UserID, Name: name,
			Sku: l.sku.ID, MemberCount: int32(count), RegionCode: pls[0].Region, CreatedAt: now,
		})
		if err != nil {
			return fmt.Errorf("insert allocation group: %w", err)
		}
		out.Group = g
		gid := uuid.NullUUID{UUID: g.ID, Valid: true}
		for i, pl := range pls {
			a, err := s.insertMember(ctx, tx, p, proj, l, spec, member{name: name + "-" + strconv.Itoa(i+1), place: pl, groupID: gid}, now)
			if err != nil {
				return err
			}
			if recordAttachments != nil {
				if err := recordAttachments(ctx, tx, a.ID); err != nil {
					return err
				}
			}
			out.Members = append(out.Members, a)
		}
		return s.recordGroup(ctx, tx, out, EventGroupCreated, "allocation_group.create", Actor{Type: ActorUser, ID: p.UserID.String()}, nil)
	})
	if err != nil {
		return GroupView{}, err
	}
	return out, nil
}

// recordGroup writes the group's outbox event and audit row.
func (s *Service) recordGroup(ctx context.Context, tx pgx.Tx, v GroupView, eventType, action string, actor Actor, moved []uuid.UUID) error {
	members := make([]string, 0, len(v.Members))
	for _, a := range v.Members {
		members = append(members, a.ID.String())
	}
	payload := map[string]any{
		"allocation_group_id": v.ID.String(), "tenant_id": v.TenantID.String(), "project_id": v.ProjectID.String(),
		"sku": v.Sku, "region_code": v.RegionCode, "allocation_ids": members,
	}
	meta := map[string]any{"sku": v.Sku, "count": v.MemberCount, "region_code": v.RegionCode, "allocation_ids": members}
	if moved != nil {
		ids := make([]string, 0, len(moved))
		for _, id := range moved {
			ids = append(ids, id.String())
		}
		payload["released_ids"], meta["released_ids"] = ids, ids
	}
	if _, err := s.Outbox.Enqueue(ctx, tx, outbox.Event{Type: eventType, Subject: "gantry.events." + eventType, Payload: payload}); err != nil {
		return fmt.Errorf("enqueue %s: %w", eventType, err)
	}
	e := audit.Entry{
		Action: action, TargetType: "allocation_group", TargetID: v.ID.String(),
		TenantID: v.TenantID, ProjectID: v.ProjectID, Metadata: meta,
	}
	if actor.Type == ActorSystem {
		e.ActorType = actor.Type
	}
	return s.Audit.Record(ctx, tx, e)
}

// GetGroup loads a group of the project with its members; one of another project is
// not found.
func (s *Service) GetGroup(ctx context.Context, projectID, id uuid.UUID) (GroupView, error) {
	q := s.read(ctx)
	g, err := q.GetGroup(ctx, allocationsdb.GetGroupParams{ID: id, ProjectID: projectID})
	if errors.Is(err, pgx.ErrNoRows) {
		return GroupView{}, groupNotFound()
	}
	if err != nil {
		return GroupView{}, fmt.Errorf("load allocation group: %w", err)
	}
	members, err := q.GroupMembers(ctx, []uuid.UUID{id})
	if err != nil {
		return GroupView{}, fmt.Errorf("group members: %w", err)
	}
	return GroupView{Group: g, Members: members}, nil
}

// ListGroups is a page of the project's groups by id, each with its members.
func (s *Service) ListGroups(ctx context.Context, projectID, afterID uuid.UUID, limit int) (Page[GroupView], error) {
	q := s.read(ctx)
	rows, err := q.ListGroups(ctx, allocationsdb.ListGroupsParams{ProjectID: projectID, After: after(afterID), Limit: int32(limit + 1)})
	if err != nil {
		return Page[GroupView]{}, fmt.Errorf("list allocation groups: %w", err)
	}
	pg := page(rows, limit)
	ids := make([]uuid.UUID, 0, len(pg.Items))
	for _, g := range pg.Items {
		ids = append(ids, g.ID)
	}
	members, err := q.GroupMembers(ctx, ids)
	if err != nil {
		return Page[GroupView]{}, fmt.Errorf("group members: %w", err)
	}
	byGroup := map[uuid.UUID][]Allocation{}
	for _, a := range members {
		byGroup[a.GroupID.UUID] = append(byGroup[a.GroupID.UUID], a)
	}
	out := Page[GroupView]{Items: make([]GroupView, 0, len(pg.Items)), More: pg.More}
	for _, g := range pg.Items {
		out.Items = append(out.Items, GroupView{Group: g, Members: byGroup[g.ID]})
	}
	return out, nil
}

// ReleaseGroup releases every releasable member together, in one transaction: the
// group and its members are locked (members in id order, like every multi-allocation
// move, so two of them cannot deadlock), each member that the lifecycle lets go moves to
// releasing with its own status event, task, outbox event and audit row, and the group
// gets one outbox event and one audit row. Members already releasing or in a final
// status stay as they are. When no member can move, the answer is the lifecycle's:
// allocation_already_releasing if a member is releasing or released, else
// allocation_not_active.
func (s *Service) ReleaseGroup(ctx context.Context, p *principal.Principal, proj projectctx.Project, id uuid.UUID) (GroupView, error) {
	if !proj.AtLeast(projectctx.RoleMember) {
		if _, err := s.GetGroup(ctx, proj.ID, id); err != nil {
			return GroupView{}, err
		}
		return GroupView{}, apierr.New(apierr.InsufficientPermissions, "viewers cannot release allocations in this project").
			With("required_role", projectctx.RoleMember)
	}
	actor := Actor{Type: ActorUser, ID: p.UserID.String()}
	var out GroupView
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := allocationsdb.New(tx)
		g, err := q.LockGroup(ctx, allocationsdb.LockGroupParams{ID: id, ProjectID: proj.ID})
		if errors.Is(err, pgx.ErrNoRows) {
			return groupNotFound()
		}
		if err != nil {
			return fmt.Errorf("lock allocation group: %w", err)
		}
		members, err := q.LockGroupMembers(ctx, uuid.NullUUID{UUID: id, Valid: true})
		if err != nil {
			return fmt.Errorf("lock group members: %w", err)
		}
		out = GroupView{Group: g, Members: members}
		var moved []uuid.UUID
		var refusal error
		for i, a := range members {
			next, res, err := s.transition(ctx, tx, a, lifecycle.Release, actor, "released with its group")
			if err != nil {
				if !errors.Is(err, lifecycle.ErrForbidden) {
					return err
				}
				// Prefer "already releasing" over "not active": the group's release is
				// then under way, which is what the caller asked for.
				if refusal == nil || apierr.CodeOf(err) == apierr.AllocationAlreadyReleasing {
					refusal = err
				}
				continue
			}
			out.Members[i] = next
			if res.Changed {
				moved = append(moved, a.ID)
			}
		}
		if len(moved) == 0 {
			if refusal == nil {
				refusal = apierr.New(apierr.AllocationNotActive, "the group has no member to release")
			}
			return refusal
		}
		now := s.now()
		if err := q.TouchGroup(ctx, allocationsdb.TouchGroupParams{ID: id, UpdatedAt: now}); err != nil {
			return fmt.Errorf("touch allocation group: %w", err)
		}
		out.UpdatedAt = now
		return s.recordGroup(ctx, tx, out, EventGroupReleased, "allocation_group.release", actor, moved)
	})
	if err != nil {
		return GroupView{}, err
	}
	// Releasing keeps the GPUs until each node acknowledges (releasing -> released), so
	// no drain can settle yet.
	return out, nil
}
