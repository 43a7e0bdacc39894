package auth

import (
	"context"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/proto/api"
)

// ListPlatformRoleBindings answers GET /api/v1/admin/platform-roles (platform.admin,
// checked by the authz table before the handler runs).
func (h *Handlers) ListPlatformRoleBindings(ctx context.Context, _ api.ListPlatformRoleBindingsRequestObject) (api.ListPlatformRoleBindingsResponseObject, error) {
	rows, err := h.svc.ListPlatformRoleBindings(ctx)
	if err != nil {
		return nil, err
	}
	out := api.PlatformRoleBindingsResponse{Roles: make([]api.PlatformRoleGroup, 0, len(PlatformRoles))}
	for _, role := range PlatformRoles {
		g := api.PlatformRoleGroup{Role: api.PlatformRole(role), Bindings: []api.PlatformRoleBinding{}, Capabilities: []api.PlatformCapability{}}
		for _, c := range principal.CapabilitiesFor([]string{role}) {
			g.Capabilities = append(g.Capabilities, api.PlatformCapability(c))
		}
		for _, r := range rows {
			if r.Role == role {
				g.Bindings = append(g.Bindings, apiRoleBinding(r))
			}
		}
		out.Roles = append(out.Roles, g)
	}
	return api.ListPlatformRoleBindings200JSONResponse{Body: out, Headers: api.ListPlatformRoleBindings200ResponseHeaders{XRequestID: requestID(ctx)}}, nil
}

// CreatePlatformRoleBinding answers POST /api/v1/admin/platform-roles/{role}/bindings
// (platform.admin and step-up, checked by the authz table).
func (h *Handlers) CreatePlatformRoleBinding(ctx context.Context, req api.CreatePlatformRoleBindingRequestObject) (api.CreatePlatformRoleBindingResponseObject, error) {
	b, created, err := h.svc.BindPlatformRole(ctx, string(req.Role), req.Body.UserID)
	if err != nil {
		return nil, err
	}
	if !created {
		return api.CreatePlatformRoleBinding200JSONResponse{Body: apiRoleBinding(b), Headers: api.CreatePlatformRoleBinding200ResponseHeaders{XRequestID: requestID(ctx)}}, nil
	}
	return api.CreatePlatformRoleBinding201JSONResponse{Body: apiRoleBinding(b), Headers: api.CreatePlatformRoleBinding201ResponseHeaders{XRequestID: requestID(ctx)}}, nil
}

// DeletePlatformRoleBinding answers DELETE
// /api/v1/admin/platform-roles/{role}/bindings/{user_id} (platform.admin and step-up).
func (h *Handlers) DeletePlatformRoleBinding(ctx context.Context, req api.DeletePlatformRoleBindingRequestObject) (api.DeletePlatformRoleBindingResponseObject, error) {
	if err := h.svc.RevokePlatformRole(ctx, string(req.Role), req.UserID); err != nil {
		return nil, err
	}
	return api.DeletePlatformRoleBinding204Response{Headers: api.DeletePlatformRoleBinding204ResponseHeaders{XRequestID: requestID(ctx)}}, nil
}

func apiRoleBinding(r RoleBinding) api.PlatformRoleBinding {
	b := api.PlatformRoleBinding{Role: api.PlatformRole(r.Role), UserID: r.UserID, Username: r.Username, GrantedAt: r.GrantedAt.UTC()}
	if r.GrantedBy.Valid {
		id := r.GrantedBy.UUID
		b.GrantedBy = &id
	}
	return b
}
