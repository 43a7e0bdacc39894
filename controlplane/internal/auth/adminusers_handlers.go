package auth

import (
	"context"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/proto/api"
)

// sortUsers names the order of admin user cursors.
const sortUsers = "admin_users:id"

// WithCursors gives the handlers the server's cursor codec (paged admin lists).
func (h *Handlers) WithCursors(c pagination.Codec) *Handlers {
	h.cursors = c
	return h
}

// ListAdminUsers answers GET /api/v1/admin/users (platform.admin, checked by the authz table).
func (h *Handlers) ListAdminUsers(ctx context.Context, req api.ListAdminUsersRequestObject) (api.ListAdminUsersResponseObject, error) {
	var after uuid.UUID
	if err := h.cursors.DecodeAfter(req.Params.Cursor, sortUsers, &after); err != nil {
		return nil, err
	}
	var f UserFilter
	if req.Params.Q != nil {
		f.Query = *req.Params.Q
	}
	if req.Params.TenantID != nil {
		f.TenantID = *req.Params.TenantID
	}
	if req.Params.Status != nil {
		f.Status = string(*req.Params.Status)
	}
	size := pagination.Size(req.Params.PageSize)
	users, more, err := h.svc.ListUsers(ctx, f, after, size)
	if err != nil {
		return nil, err
	}
	var last uuid.UUID
	if n := len(users); n > 0 {
		last = users[n-1].ID
	}
	next, err := h.cursors.Next(more, sortUsers, last)
	if err != nil {
		return nil, err
	}
	out := api.AdminUserListResponse{Items: make([]api.AdminUser, 0, len(users)), Pagination: api.Pagination{NextCursor: next, PageSize: size}}
	for _, u := range users {
		out.Items = append(out.Items, apiAdminUser(u))
	}
	return api.ListAdminUsers200JSONResponse{Body: out, Headers: api.ListAdminUsers200ResponseHeaders{XRequestID: requestID(ctx)}}, nil
}

// GetAdminUser answers GET /api/v1/admin/users/{user_id}.
func (h *Handlers) GetAdminUser(ctx context.Context, req api.GetAdminUserRequestObject) (api.GetAdminUserResponseObject, error) {
	u, err := h.svc.GetUser(ctx, req.UserID)
	if err != nil {
		return nil, err
	}
	return api.GetAdminUser200JSONResponse{Body: apiAdminUser(u), Headers: api.GetAdminUser200ResponseHeaders{XRequestID: requestID(ctx)}}, nil
}

// UpdateAdminUser answers PATCH /api/v1/admin/users/{user_id} (reset_mfa needs step-up:
// checked by the service before anything changes).
func (h *Handlers) UpdateAdminUser(ctx context.Context, req api.UpdateAdminUserRequestObject) (api.UpdateAdminUserResponseObject, error) {
	var c UserChange
	if req.Body.Status != nil {
		c.Status = string(*req.Body.Status)
	}
	c.ResetMFA = req.Body.ResetMfa != nil && bool(*req.Body.ResetMfa)
	u, err := h.svc.UpdateUser(ctx, req.UserID, c)
	if err != nil {
		return nil, err
	}
	return api.UpdateAdminUser200JSONResponse{Body: apiAdminUser(u), Headers: api.UpdateAdminUser200ResponseHeaders{XRequestID: requestID(ctx)}}, nil
}

func apiAdminUser(u AdminUser) api.AdminUser {
	out := api.AdminUser{
		ID: u.ID, Username: u.Username, DisplayName: u.DisplayName, Role: api.AdminUserRole(u.Role),
		Status: api.UserStatus(u.Status), MfaEnabled: u.MfaEnabled,
		CreatedAt: u.CreatedAt.UTC(), UpdatedAt: u.UpdatedAt.UTC(),
		PlatformRoles: make([]api.PlatformRole, 0, len(u.PlatformRoles)),
	}
	if u.TenantID.Valid {
		id := u.TenantID.UUID
		out.TenantID = &id
	}
	if u.TenantRole != nil {
		r := api.AdminUserTenantRole(*u.TenantRole)
		out.TenantRole = &r
	}
	for _, r := range u.PlatformRoles {
		out.PlatformRoles = append(out.PlatformRoles, api.PlatformRole(r))
	}
	if len(out.PlatformRoles) == 0 {
		out.PlatformRoles = append(out.PlatformRoles, api.PlatformRole("platform_user"))
	}
	return out
}
