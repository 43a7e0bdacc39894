package tenancy

import (
	"context"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy/tenancydb"
	"github.com/gantry-gpu/gantry/proto/api"
)

// ListTenants implements GET /api/v1/admin/tenants.
func (h *Handlers) ListTenants(ctx context.Context, req api.ListTenantsRequestObject) (api.ListTenantsResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	if err := requirePlatformAdmin(p); err != nil {
		return nil, err
	}
	after, err := h.after(req.Params.Cursor, sortTenants)
	if err != nil {
		return nil, err
	}
	size := pagination.Size(req.Params.PageSize)
	pg, err := h.Svc.ListTenants(ctx, p, after, size)
	if err != nil {
		return nil, err
	}
	info, err := pageInfo(h, sortTenants, pg, size, func(t tenancydb.Tenant) uuid.UUID { return t.ID })
	if err != nil {
		return nil, err
	}
	out := api.TenantListResponse{Items: make([]api.Tenant, 0, len(pg.Items)), Pagination: info}
	for _, t := range pg.Items {
		out.Items = append(out.Items, apiTenant(t))
	}
	return api.ListTenants200JSONResponse{Body: out}, nil
}

// CreateTenant implements POST /api/v1/admin/tenants.
func (h *Handlers) CreateTenant(ctx context.Context, req api.CreateTenantRequestObject) (api.CreateTenantResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	b := req.Body
	in := ProvisionInput{
		Name: b.Name, Slug: b.Slug, AdminField: "admin.username",
		Admin: NewUser{Username: b.Admin.Username, Password: b.Admin.Password, DisplayName: deref(b.Admin.DisplayName)},
	}
	if b.DefaultCurrency != nil {
		in.DefaultCurrency = *b.DefaultCurrency
	}
	out, err := h.Svc.CreateTenant(ctx, p, in)
	if err != nil {
		return nil, err
	}
	return api.CreateTenant201JSONResponse{Body: api.CreateTenantResponse{
		Tenant: apiTenant(out.Tenant), AdminUser: apiTenantUser(out.Admin),
		DefaultDepartment: apiDepartment(out.Department), DefaultProject: apiProject(out.Project),
	}}, nil
}

// GetTenant implements GET /api/v1/admin/tenants/{tenant_id}.
func (h *Handlers) GetTenant(ctx context.Context, req api.GetTenantRequestObject) (api.GetTenantResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	t, err := h.Svc.GetTenant(ctx, p, req.TenantID)
	if err != nil {
		return nil, err
	}
	return api.GetTenant200JSONResponse{Body: apiTenant(t)}, nil
}

// UpdateTenant implements PATCH /api/v1/admin/tenants/{tenant_id}.
func (h *Handlers) UpdateTenant(ctx context.Context, req api.UpdateTenantRequestObject) (api.UpdateTenantResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	patch := TenantPatch{Name: req.Body.Name}
	if req.Body.Status != nil {
		s := string(*req.Body.Status)
		patch.Status = &s
	}
	t, err := h.Svc.UpdateTenant(ctx, p, req.TenantID, patch)
	if err != nil {
		return nil, err
	}
	return api.UpdateTenant200JSONResponse{Body: apiTenant(t)}, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
