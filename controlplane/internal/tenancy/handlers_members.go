package tenancy

import (
	"context"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/proto/api"
)

// ListProjectMembers implements GET /api/v1/projects/{project_id}/members.
func (h *Handlers) ListProjectMembers(ctx context.Context, req api.ListProjectMembersRequestObject) (api.ListProjectMembersResponseObject, error) {
	pc, err := projectOf(ctx, req.ProjectID)
	if err != nil {
		return nil, err
	}
	after, err := h.after(req.Params.Cursor, sortMembers)
	if err != nil {
		return nil, err
	}
	size := pagination.Size(req.Params.PageSize)
	pg, err := h.Svc.ListMembers(ctx, pc, after, size)
	if err != nil {
		return nil, err
	}
	info, err := pageInfo(h, sortMembers, pg, size, func(m Member) uuid.UUID { return m.UserID })
	if err != nil {
		return nil, err
	}
	out := api.ProjectMemberListResponse{Items: make([]api.ProjectMember, 0, len(pg.Items)), Pagination: info}
	for _, m := range pg.Items {
		out.Items = append(out.Items, apiMember(m))
	}
	return api.ListProjectMembers200JSONResponse{Body: out}, nil
}

// AddProjectMember implements POST /api/v1/projects/{project_id}/members.
func (h *Handlers) AddProjectMember(ctx context.Context, req api.AddProjectMemberRequestObject) (api.AddProjectMemberResponseObject, error) {
	pc, err := projectOf(ctx, req.ProjectID)
	if err != nil {
		return nil, err
	}
	m, err := h.Svc.AddMember(ctx, pc, req.Body.UserID, string(req.Body.Role))
	if err != nil {
		return nil, err
	}
	return api.AddProjectMember201JSONResponse{Body: apiMember(m)}, nil
}

// UpdateProjectMember implements PATCH /api/v1/projects/{project_id}/members/{member_id}.
func (h *Handlers) UpdateProjectMember(ctx context.Context, req api.UpdateProjectMemberRequestObject) (api.UpdateProjectMemberResponseObject, error) {
	pc, err := projectOf(ctx, req.ProjectID)
	if err != nil {
		return nil, err
	}
	m, err := h.Svc.UpdateMember(ctx, pc, req.MemberID, string(req.Body.Role))
	if err != nil {
		return nil, err
	}
	return api.UpdateProjectMember200JSONResponse{Body: apiMember(m)}, nil
}

// RemoveProjectMember implements DELETE /api/v1/projects/{project_id}/members/{member_id}.
func (h *Handlers) RemoveProjectMember(ctx context.Context, req api.RemoveProjectMemberRequestObject) (api.RemoveProjectMemberResponseObject, error) {
	pc, err := projectOf(ctx, req.ProjectID)
	if err != nil {
		return nil, err
	}
	if err := h.Svc.RemoveMember(ctx, pc, req.MemberID); err != nil {
		return nil, err
	}
	return api.RemoveProjectMember204Response{}, nil
}
