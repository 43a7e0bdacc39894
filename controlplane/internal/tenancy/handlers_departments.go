package tenancy

import (
	"context"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy/tenancydb"
	"github.com/gantry-gpu/gantry/proto/api"
)

// ListDepartments implements GET /api/v1/departments.
func (h *Handlers) ListDepartments(ctx context.Context, req api.ListDepartmentsRequestObject) (api.ListDepartmentsResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	after, err := h.after(req.Params.Cursor, sortDepartments)
	if err != nil {
		return nil, err
	}
	size := pagination.Size(req.Params.PageSize)
	pg, err := h.Svc.ListDepartments(ctx, p, after, size)
	if err != nil {
		return nil, err
	}
	info, err := pageInfo(h, sortDepartments, pg, size, func(d tenancydb.Department) uuid.UUID { return d.ID })
	if err != nil {
		return nil, err
	}
	out := api.DepartmentListResponse{Items: make([]api.Department, 0, len(pg.Items)), Pagination: info}
	for _, d := range pg.Items {
		out.Items = append(out.Items, apiDepartment(d))
	}
	return api.ListDepartments200JSONResponse{Body: out}, nil
}

// CreateDepartment implements POST /api/v1/departments.
func (h *Handlers) CreateDepartment(ctx context.Context, req api.CreateDepartmentRequestObject) (api.CreateDepartmentResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	d, err := h.Svc.CreateDepartment(ctx, p, req.Body.DisplayName, req.Body.Slug)
	if err != nil {
		return nil, err
	}
	return api.CreateDepartment201JSONResponse{Body: apiDepartment(d)}, nil
}

// GetDepartment implements GET /api/v1/departments/{department_id}.
func (h *Handlers) GetDepartment(ctx context.Context, req api.GetDepartmentRequestObject) (api.GetDepartmentResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	d, err := h.Svc.GetDepartment(ctx, p, req.DepartmentID)
	if err != nil {
		return nil, err
	}
	return api.GetDepartment200JSONResponse{Body: apiDepartment(d)}, nil
}

// UpdateDepartment implements PATCH /api/v1/departments/{department_id}.
func (h *Handlers) UpdateDepartment(ctx context.Context, req api.UpdateDepartmentRequestObject) (api.UpdateDepartmentResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	patch := DepartmentPatch{DisplayName: req.Body.DisplayName}
	if req.Body.LifecycleState != nil {
		s := string(*req.Body.LifecycleState)
		patch.LifecycleState = &s
	}
	d, err := h.Svc.UpdateDepartment(ctx, p, req.DepartmentID, patch)
	if err != nil {
		return nil, err
	}
	return api.UpdateDepartment200JSONResponse{Body: apiDepartment(d)}, nil
}
