package tenancy

import (
	"context"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy/tenancydb"
	"github.com/gantry-gpu/gantry/proto/api"
)

// GetMe implements GET /api/v1/me.
func (h *Handlers) GetMe(ctx context.Context, _ api.GetMeRequestObject) (api.GetMeResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	me, err := h.Svc.Me(ctx, p)
	if err != nil {
		return nil, err
	}
	amount, currency, err := h.Balance.Balance(ctx, me.OrgID)
	if err != nil {
		return nil, err
	}
	out := api.UserWithBalance{
		ID: me.User.ID, Username: me.User.Username, Role: api.UserRole(me.User.Role),
		PlatformRoles:        make([]api.PlatformRole, 0, len(p.PlatformRole)),
		PlatformCapabilities: make([]api.PlatformCapability, 0, len(p.Capabilities)),
		PlatformRoleSource:   api.UserWithBalancePlatformRoleSource(roleSource(p)),
		Balance:              api.Money{AmountMinor: amount, Currency: currency},
	}
	for _, r := range p.PlatformRole {
		out.PlatformRoles = append(out.PlatformRoles, api.PlatformRole(r))
	}
	for _, c := range p.Capabilities {
		out.PlatformCapabilities = append(out.PlatformCapabilities, api.PlatformCapability(c))
	}
	if me.OrgID != uuid.Nil {
		out.OrgID, out.OrgName = &me.OrgID, &me.OrgName
	}
	if me.ProjectID != uuid.Nil {
		out.ProjectID, out.ProjectName = &me.ProjectID, &me.ProjectName
	}
	return api.GetMe200JSONResponse{Body: out}, nil
}

func roleSource(p *principal.Principal) string {
	if p.RoleSource == "" {
		return principal.RoleSourceBindings
	}
	return p.RoleSource
}

// ListTenantUsers implements GET /api/v1/users.
func (h *Handlers) ListTenantUsers(ctx context.Context, req api.ListTenantUsersRequestObject) (api.ListTenantUsersResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := requireTenantAdmin(p); err != nil {
		return nil, err
	}
	after, err := h.after(req.Params.Cursor, sortUsers)
	if err != nil {
		return nil, err
	}
	size := pagination.Size(req.Params.PageSize)
	pg, err := h.Svc.ListUsers(ctx, p, after, size)
	if err != nil {
		return nil, err
	}
	info, err := pageInfo(h, sortUsers, pg, size, func(u tenancydb.User) uuid.UUID { return u.ID })
	if err != nil {
		return nil, err
	}
	out := api.TenantUserListResponse{Items: make([]api.TenantUser, 0, len(pg.Items)), Pagination: info}
	for _, u := range pg.Items {
		out.Items = append(out.Items, apiTenantUser(u))
	}
	return api.ListTenantUsers200JSONResponse{Body: out}, nil
}

// CreateTenantUser implements POST /api/v1/users.
func (h *Handlers) CreateTenantUser(ctx context.Context, req api.CreateTenantUserRequestObject) (api.CreateTenantUserResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	b := req.Body
	u, err := h.Svc.CreateUser(ctx, p, NewUser{
		Username: b.Username, Password: b.Password, DisplayName: deref(b.DisplayName), TenantRole: string(b.TenantRole),
	})
	if err != nil {
		return nil, err
	}
	return api.CreateTenantUser201JSONResponse{Body: apiTenantUser(u)}, nil
}

// GetTenantUser implements GET /api/v1/users/{user_id}.
func (h *Handlers) GetTenantUser(ctx context.Context, req api.GetTenantUserRequestObject) (api.GetTenantUserResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	u, err := h.Svc.GetUser(ctx, p, req.UserID)
	if err != nil {
		return nil, err
	}
	return api.GetTenantUser200JSONResponse{Body: apiTenantUser(u)}, nil
}
