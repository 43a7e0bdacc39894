package auth

import (
	"context"
	"maps"
	"net/http"
	"slices"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Enterprise sign-in and the tenant identity-provider settings (oidc.go).

func identityProviderBody(ip IdentityProvider) api.IdentityProvider {
	return api.IdentityProvider{
		TenantID: ip.TenantID, Provider: ip.Slug, Issuer: ip.Issuer, ClientID: ip.ClientID,
		ClientSecretSet: ip.ClientSecretSet, RedirectURL: ip.RedirectURL, AllowedDomains: ip.AllowedDomains,
		RoleClaim: ip.RoleClaim, RoleMapping: roleMappingBody(ip.RoleMapping), PasswordSignIn: ip.PasswordSignIn,
		StartURL:  "/api/v1/auth/oidc/" + ip.Slug + "/start",
		CreatedAt: ip.CreatedAt, UpdatedAt: ip.UpdatedAt,
	}
}

// roleMappingBody lists the mapping by claim value, so answers are stable.
func roleMappingBody(m map[string]string) []api.IdentityProviderRoleMapping {
	out := make([]api.IdentityProviderRoleMapping, 0, len(m))
	for _, v := range slices.Sorted(maps.Keys(m)) {
		out = append(out, api.IdentityProviderRoleMapping{Value: v, Role: api.IdentityProviderRoleMappingRole(m[v])})
	}
	return out
}

// StartOIDCSignIn redirects the browser to the tenant's provider and sets the flow cookie.
func (h *Handlers) StartOIDCSignIn(ctx context.Context, req api.StartOIDCSignInRequestObject) (api.StartOIDCSignInResponseObject, error) {
	st, err := h.svc.StartOIDC(ctx, req.Provider)
	if err != nil {
		return nil, err
	}
	c := http.Cookie{
		Name: OIDCFlowCookie, Value: st.Cookie, Path: "/api/v1/auth/oidc",
		MaxAge: int(st.MaxAge.Seconds()), HttpOnly: true, Secure: st.SecureURL, SameSite: http.SameSiteLaxMode,
	}
	return api.StartOIDCSignIn302Response{Headers: api.StartOIDCSignIn302ResponseHeaders{
		Location: st.AuthURL, SetCookie: c.String(), XRequestID: requestID(ctx),
	}}, nil
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// FinishOIDCSignIn completes the sign-in and answers our tokens.
func (h *Handlers) FinishOIDCSignIn(ctx context.Context, req api.FinishOIDCSignInRequestObject) (api.FinishOIDCSignInResponseObject, error) {
	p := req.Params
	tokens, err := h.svc.FinishOIDC(ctx, req.Provider, OIDCCallback{
		State: deref(p.State), Code: deref(p.Code), Error: deref(p.Error), Cookie: deref(p.GantryOidc),
	})
	if err != nil {
		return nil, err
	}
	return api.FinishOIDCSignIn200JSONResponse{Body: tokenResponse(tokens, h.cfg), Headers: api.FinishOIDCSignIn200ResponseHeaders{XRequestID: requestID(ctx)}}, nil
}

// GetTenantIdentityProvider returns a tenant's federation settings (no secret).
func (h *Handlers) GetTenantIdentityProvider(ctx context.Context, req api.GetTenantIdentityProviderRequestObject) (api.GetTenantIdentityProviderResponseObject, error) {
	ip, err := h.svc.GetIdentityProvider(ctx, uuid.UUID(req.TenantID))
	if err != nil {
		return nil, err
	}
	return api.GetTenantIdentityProvider200JSONResponse{Body: identityProviderBody(ip), Headers: api.GetTenantIdentityProvider200ResponseHeaders{XRequestID: requestID(ctx)}}, nil
}

// PutTenantIdentityProvider stores a tenant's federation settings.
func (h *Handlers) PutTenantIdentityProvider(ctx context.Context, req api.PutTenantIdentityProviderRequestObject) (api.PutTenantIdentityProviderResponseObject, error) {
	if req.Body == nil {
		return nil, apierr.New(apierr.InvalidRequest, "request body is required")
	}
	b := req.Body
	if b.ClientSecret == nil || *b.ClientSecret == "" {
		return nil, apierr.Validation("client_secret", "client_secret is required")
	}
	in := IdentityProviderInput{
		Issuer: b.Issuer, ClientID: b.ClientID, ClientSecret: *b.ClientSecret, RedirectURL: b.RedirectURL,
		AllowedDomains: b.AllowedDomains, RoleClaim: deref(b.RoleClaim),
	}
	if b.RoleMapping != nil {
		in.RoleMapping = map[string]string{}
		for _, m := range b.RoleMapping {
			if _, dup := in.RoleMapping[m.Value]; dup {
				return nil, apierr.Validation("role_mapping", "role_mapping names %q twice", m.Value)
			}
			in.RoleMapping[m.Value] = string(m.Role)
		}
	}
	if b.PasswordSignIn != nil {
		in.PasswordSignIn = *b.PasswordSignIn
	}
	ip, err := h.svc.PutIdentityProvider(ctx, uuid.UUID(req.TenantID), in)
	if err != nil {
		return nil, err
	}
	return api.PutTenantIdentityProvider200JSONResponse{Body: identityProviderBody(ip), Headers: api.PutTenantIdentityProvider200ResponseHeaders{XRequestID: requestID(ctx)}}, nil
}

// DeleteTenantIdentityProvider removes a tenant's federation settings.
func (h *Handlers) DeleteTenantIdentityProvider(ctx context.Context, req api.DeleteTenantIdentityProviderRequestObject) (api.DeleteTenantIdentityProviderResponseObject, error) {
	if err := h.svc.DeleteIdentityProvider(ctx, uuid.UUID(req.TenantID)); err != nil {
		return nil, err
	}
	return api.DeleteTenantIdentityProvider204Response{Headers: api.DeleteTenantIdentityProvider204ResponseHeaders{XRequestID: requestID(ctx)}}, nil
}
