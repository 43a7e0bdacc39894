package allocations

import (
	"context"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/lifecycle"
	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/proto/api"
)

const sortGroups = "allocation_groups.id"

// RestartAllocation implements POST /api/v1/allocations/{allocation_id}/restart.
func (h *Handlers) RestartAllocation(ctx context.Context, req api.RestartAllocationRequestObject) (api.RestartAllocationResponseObject, error) {
	p, proj, err := scope(ctx)
	if err != nil {
		return nil, err
	}
	a, err := h.Svc.Restart(ctx, p, proj, req.AllocationID)
	if err != nil {
		return nil, err
	}
	v, err := h.view(ctx, a)
	if err != nil {
		return nil, err
	}
	return api.RestartAllocation200JSONResponse{Body: v}, nil
}

// apiGroup is the contract's view of a group (without its members).
func apiGroup(g GroupView) api.AllocationGroup {
	out := api.AllocationGroup{
		ID: g.ID, Name: g.Name, TenantID: g.TenantID, ProjectID: g.ProjectID, OwnerUserID: g.OwnerUserID, Sku: g.Sku,
		Count: int(g.MemberCount), RegionCode: g.RegionCode, AllocationIds: make([]uuid.UUID, 0, len(g.Members)),
		CreatedAt: g.CreatedAt, UpdatedAt: g.UpdatedAt,
	}
	for _, a := range g.Members {
		out.AllocationIds = append(out.AllocationIds, a.ID)
		if !lifecycle.IsFinal(lifecycle.Status(a.Status)) {
			out.LiveCount++
		}
	}
	return out
}

// groupDetail is the contract's view of a group with its members.
func (h *Handlers) groupDetail(ctx context.Context, g GroupView) (api.AllocationGroupDetail, error) {
	members, err := h.views(ctx, g.Members)
	if err != nil {
		return api.AllocationGroupDetail{}, err
	}
	s := apiGroup(g)
	return api.AllocationGroupDetail{
		ID: s.ID, Name: s.Name, TenantID: s.TenantID, ProjectID: s.ProjectID, OwnerUserID: s.OwnerUserID, Sku: s.Sku,
		Count: s.Count, RegionCode: s.RegionCode, AllocationIds: s.AllocationIds, LiveCount: s.LiveCount,
		CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt, Members: members,
	}, nil
}

// ListAllocationGroups implements GET /api/v1/allocation-groups.
func (h *Handlers) ListAllocationGroups(ctx context.Context, req api.ListAllocationGroupsRequestObject) (api.ListAllocationGroupsResponseObject, error) {
	_, proj, err := scope(ctx)
	if err != nil {
		return nil, err
	}
	after, err := h.cursor(req.Params.Cursor, sortGroups)
	if err != nil {
		return nil, err
	}
	size := pagination.Size(req.Params.PageSize)
	pg, err := h.Svc.ListGroups(ctx, proj.ID, after, size)
	if err != nil {
		return nil, err
	}
	out := api.AllocationGroupListResponse{Items: make([]api.AllocationGroup, 0, len(pg.Items))}
	for _, g := range pg.Items {
		out.Items = append(out.Items, apiGroup(g))
	}
	if out.Pagination, err = nextPage(h, pg, func(g GroupView) uuid.UUID { return g.ID }, sortGroups, size); err != nil {
		return nil, err
	}
	return api.ListAllocationGroups200JSONResponse{Body: out}, nil
}

// CreateAllocationGroup implements POST /api/v1/allocation-groups.
func (h *Handlers) CreateAllocationGroup(ctx context.Context, req api.CreateAllocationGroupRequestObject) (api.CreateAllocationGroupResponseObject, error) {
	p, proj, err := scope(ctx)
	if err != nil {
		return nil, err
	}
	b := req.Body
	spec := CreateSpec{Name: b.Name, SKU: b.Sku, KeyIDs: b.SSHKeyIds}
	if b.RegionCode != nil {
		spec.Region = *b.RegionCode
	}
	if b.OsImageID != nil {
		spec.OSImageID = uuid.NullUUID{UUID: *b.OsImageID, Valid: true}
	}
	spec.Attachments = attachmentSpecs(b.StorageAttachments)
	g, err := h.Svc.CreateGroup(ctx, p, proj, spec, b.Count)
	if err != nil {
		return nil, err
	}
	d, err := h.groupDetail(ctx, g)
	if err != nil {
		return nil, err
	}
	return api.CreateAllocationGroup201JSONResponse{Body: d}, nil
}

// GetAllocationGroup implements GET /api/v1/allocation-groups/{allocation_group_id}.
func (h *Handlers) GetAllocationGroup(ctx context.Context, req api.GetAllocationGroupRequestObject) (api.GetAllocationGroupResponseObject, error) {
	_, proj, err := scope(ctx)
	if err != nil {
		return nil, err
	}
	g, err := h.Svc.GetGroup(ctx, proj.ID, req.AllocationGroupID)
	if err != nil {
		return nil, err
	}
	d, err := h.groupDetail(ctx, g)
	if err != nil {
		return nil, err
	}
	return api.GetAllocationGroup200JSONResponse{Body: d}, nil
}

// ReleaseAllocationGroup implements POST /api/v1/allocation-groups/{allocation_group_id}/release.
func (h *Handlers) ReleaseAllocationGroup(ctx context.Context, req api.ReleaseAllocationGroupRequestObject) (api.ReleaseAllocationGroupResponseObject, error) {
	p, proj, err := scope(ctx)
	if err != nil {
		return nil, err
	}
	g, err := h.Svc.ReleaseGroup(ctx, p, proj, req.AllocationGroupID)
	if err != nil {
		return nil, err
	}
	d, err := h.groupDetail(ctx, g)
	if err != nil {
		return nil, err
	}
	return api.ReleaseAllocationGroup200JSONResponse{Body: d}, nil
}
