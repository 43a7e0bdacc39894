package machineid

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/machineid/machineiddb"
	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers implements the ServiceAccounts, ProjectAccessCredentials and
// AdminAccessCredentials operations and POST /api/v1/auth/token.
type Handlers struct {
	Svc     *Service
	Cursors pagination.Codec
}

// NewHandlers returns the handlers over svc.
func NewHandlers(svc *Service, cursors pagination.Codec) *Handlers {
	return &Handlers{Svc: svc, Cursors: cursors}
}

const (
	sortServiceAccounts = "service_accounts.id"
	sortCredentials     = "access_credentials.id_desc"
)

func optUUID(u uuid.NullUUID) *uuid.UUID {
	if !u.Valid {
		return nil
	}
	v := u.UUID
	return &v
}

func (h *Handlers) apiCredential(c machineiddb.AccessCredential) api.AccessCredential {
	out := api.AccessCredential{
		ID: c.ID, Kind: api.AccessCredentialKind(c.Kind), TenantID: c.TenantID, Name: c.Name, ClientID: c.ClientID,
		ServiceAccountID: optUUID(c.ServiceAccountID), ProjectID: optUUID(c.ProjectID),
		Status: api.AccessCredentialStatus(Status(c, h.Svc.clock.Now())), ExpiresAt: c.ExpiresAt, LastUsedAt: c.LastUsedAt,
		CreatedBy: optUUID(c.CreatedBy), CreatedAt: c.CreatedAt, RevokedAt: c.RevokedAt,
	}
	if c.ProjectRole != nil {
		r := api.AccessCredentialRole(*c.ProjectRole)
		out.Role = &r
	}
	return out
}

// apiCreated is a new credential with its secret, flat (see CreatedAccessCredential).
func (h *Handlers) apiCreated(c Created) api.CreatedAccessCredential {
	a := h.apiCredential(c.Credential)
	out := api.CreatedAccessCredential{
		ID: a.ID, Kind: a.Kind, TenantID: a.TenantID, Name: a.Name, ClientID: a.ClientID,
		ServiceAccountID: a.ServiceAccountID, ProjectID: a.ProjectID, Status: a.Status, ExpiresAt: a.ExpiresAt,
		LastUsedAt: a.LastUsedAt, CreatedBy: a.CreatedBy, CreatedAt: a.CreatedAt, RevokedAt: a.RevokedAt,
		ClientSecret: c.Secret,
	}
	if a.Role != nil {
		r := api.CreatedAccessCredentialRole(*a.Role)
		out.Role = &r
	}
	return out
}

func apiServiceAccount(sa ServiceAccount) api.ServiceAccount {
	out := api.ServiceAccount{ID: sa.ID, TenantID: sa.TenantID, Name: sa.Name, Description: sa.Description,
		ProjectRoles: make([]api.ServiceAccountProjectRole, 0, len(sa.Roles)), CreatedBy: optUUID(sa.CreatedBy), CreatedAt: sa.CreatedAt}
	for _, r := range sa.Roles {
		out.ProjectRoles = append(out.ProjectRoles, api.ServiceAccountProjectRole{ProjectID: r.ProjectID, Role: api.MachineProjectRole(r.Role)})
	}
	return out
}

// ListServiceAccounts implements GET /api/v1/service-accounts.
func (h *Handlers) ListServiceAccounts(ctx context.Context, req api.ListServiceAccountsRequestObject) (api.ListServiceAccountsResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	var after uuid.UUID
	if err := h.Cursors.DecodeAfter(req.Params.Cursor, sortServiceAccounts, &after); err != nil {
		return nil, err
	}
	size := pagination.Size(req.Params.PageSize)
	items, more, err := h.Svc.ListServiceAccounts(ctx, p.TenantID, after, size)
	if err != nil {
		return nil, err
	}
	out := api.ServiceAccountListResponse{Items: make([]api.ServiceAccount, 0, len(items)), Pagination: api.Pagination{PageSize: size}}
	for _, sa := range items {
		out.Items = append(out.Items, apiServiceAccount(sa))
	}
	if more {
		if out.Pagination.NextCursor, err = h.Cursors.Next(true, sortServiceAccounts, items[len(items)-1].ID); err != nil {
			return nil, err
		}
	}
	return api.ListServiceAccounts200JSONResponse{Body: out}, nil
}

// CreateServiceAccount implements POST /api/v1/service-accounts.
func (h *Handlers) CreateServiceAccount(ctx context.Context, req api.CreateServiceAccountRequestObject) (api.CreateServiceAccountResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	if req.Body == nil {
		return nil, apierr.New(apierr.InvalidRequest, "request body is required")
	}
	var roles []ProjectRole
	for _, r := range req.Body.ProjectRoles {
		roles = append(roles, ProjectRole{ProjectID: r.ProjectID, Role: string(r.Role)})
	}
	desc := ""
	if req.Body.Description != nil {
		desc = *req.Body.Description
	}
	sa, err := h.Svc.CreateServiceAccount(ctx, p, req.Body.Name, desc, roles)
	if err != nil {
		return nil, err
	}
	return api.CreateServiceAccount201JSONResponse{Body: apiServiceAccount(sa)}, nil
}

// DeleteServiceAccount implements DELETE /api/v1/service-accounts/{service_account_id}.
func (h *Handlers) DeleteServiceAccount(ctx context.Context, req api.DeleteServiceAccountRequestObject) (api.DeleteServiceAccountResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	if err := h.Svc.DeleteServiceAccount(ctx, p, req.ServiceAccountID); err != nil {
		return nil, err
	}
	return api.DeleteServiceAccount204Response{}, nil
}

// CreateServiceAccountCredential implements POST /api/v1/service-accounts/{id}/credentials.
func (h *Handlers) CreateServiceAccountCredential(ctx context.Context, req api.CreateServiceAccountCredentialRequestObject) (api.CreateServiceAccountCredentialResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	if req.Body == nil {
		return nil, apierr.New(apierr.InvalidRequest, "request body is required")
	}
	c, err := h.Svc.CreateServiceAccountCredential(ctx, p, req.ServiceAccountID, req.Body.Name, req.Body.ExpiresAt)
	if err != nil {
		return nil, err
	}
	return api.CreateServiceAccountCredential201JSONResponse{
		Body: h.apiCreated(c),
	}, nil
}

func project(ctx context.Context) (projectctx.Project, error) {
	proj, ok := projectctx.From(ctx)
	if !ok {
		return projectctx.Project{}, apierr.Forbidden("you do not have access to this project")
	}
	return proj, nil
}

func (h *Handlers) listPage(ctx context.Context, f ListFilter, cursor *string, pageSize *int) (api.AccessCredentialListResponse, error) {
	if err := h.Cursors.DecodeAfter(cursor, sortCredentials, &f.Before); err != nil {
		return api.AccessCredentialListResponse{}, err
	}
	size := pagination.Size(pageSize)
	rows, more, err := h.Svc.ListCredentials(ctx, f, size)
	if err != nil {
		return api.AccessCredentialListResponse{}, err
	}
	out := api.AccessCredentialListResponse{Items: make([]api.AccessCredential, 0, len(rows)), Pagination: api.Pagination{PageSize: size}}
	for _, c := range rows {
		out.Items = append(out.Items, h.apiCredential(c))
	}
	if more {
		if out.Pagination.NextCursor, err = h.Cursors.Next(true, sortCredentials, rows[len(rows)-1].ID); err != nil {
			return api.AccessCredentialListResponse{}, err
		}
	}
	return out, nil
}

// ListProjectAccessCredentials implements GET /api/v1/projects/{project_id}/access-credentials.
func (h *Handlers) ListProjectAccessCredentials(ctx context.Context, req api.ListProjectAccessCredentialsRequestObject) (api.ListProjectAccessCredentialsResponseObject, error) {
	proj, err := project(ctx)
	if err != nil {
		return nil, err
	}
	out, err := h.listPage(ctx, ListFilter{TenantID: proj.TenantID, ProjectID: proj.ID, Kind: principal.MachineProjectCredential}, req.Params.Cursor, req.Params.PageSize)
	if err != nil {
		return nil, err
	}
	return api.ListProjectAccessCredentials200JSONResponse{Body: out}, nil
}

// CreateProjectAccessCredential implements POST /api/v1/projects/{project_id}/access-credentials.
func (h *Handlers) CreateProjectAccessCredential(ctx context.Context, req api.CreateProjectAccessCredentialRequestObject) (api.CreateProjectAccessCredentialResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	proj, err := project(ctx)
	if err != nil {
		return nil, err
	}
	if req.Body == nil {
		return nil, apierr.New(apierr.InvalidRequest, "request body is required")
	}
	c, err := h.Svc.CreateProjectCredential(ctx, p, proj, req.Body.Name, string(req.Body.Role), req.Body.ExpiresAt)
	if err != nil {
		return nil, err
	}
	return api.CreateProjectAccessCredential201JSONResponse{
		Body: h.apiCreated(c),
	}, nil
}

// DeleteProjectAccessCredential implements DELETE /api/v1/projects/{project_id}/access-credentials/{credential_id}.
func (h *Handlers) DeleteProjectAccessCredential(ctx context.Context, req api.DeleteProjectAccessCredentialRequestObject) (api.DeleteProjectAccessCredentialResponseObject, error) {
	proj, err := project(ctx)
	if err != nil {
		return nil, err
	}
	if err := h.Svc.Revoke(ctx, req.CredentialID, proj.ID); err != nil {
		return nil, err
	}
	return api.DeleteProjectAccessCredential204Response{}, nil
}

// ListAdminAccessCredentials implements GET /api/v1/admin/access-credentials.
func (h *Handlers) ListAdminAccessCredentials(ctx context.Context, req api.ListAdminAccessCredentialsRequestObject) (api.ListAdminAccessCredentialsResponseObject, error) {
	var f ListFilter
	if req.Params.TenantID != nil {
		f.TenantID = *req.Params.TenantID
	}
	if req.Params.Kind != nil {
		f.Kind = string(*req.Params.Kind)
	}
	if req.Params.Status != nil {
		f.Status = string(*req.Params.Status)
	}
	out, err := h.listPage(ctx, f, req.Params.Cursor, req.Params.PageSize)
	if err != nil {
		return nil, err
	}
	return api.ListAdminAccessCredentials200JSONResponse{Body: out}, nil
}

// RevokeAdminAccessCredential implements DELETE /api/v1/admin/access-credentials/{credential_id}.
func (h *Handlers) RevokeAdminAccessCredential(ctx context.Context, req api.RevokeAdminAccessCredentialRequestObject) (api.RevokeAdminAccessCredentialResponseObject, error) {
	if err := h.Svc.Revoke(ctx, req.CredentialID, uuid.Nil); err != nil {
		return nil, err
	}
	return api.RevokeAdminAccessCredential204Response{}, nil
}

type rawRequestKey struct{}

// StrictMiddleware is an api.StrictMiddlewareFunc: for IssueAccessToken it puts the raw
// request on the context, since the grant reads the Basic header and the form body
// alone (never the query string the generated binder merges in).
func (h *Handlers) StrictMiddleware(f api.StrictHandlerFunc, operationID string) api.StrictHandlerFunc {
	if operationID != "IssueAccessToken" {
		return f
	}
	return func(ctx context.Context, w http.ResponseWriter, r *http.Request, request any) (any, error) {
		return f(context.WithValue(ctx, rawRequestKey{}, r), w, r, request)
	}
}

// IssueAccessToken implements POST /api/v1/auth/token (RFC 6749 §4.4).
func (h *Handlers) IssueAccessToken(ctx context.Context, _ api.IssueAccessTokenRequestObject) (api.IssueAccessTokenResponseObject, error) {
	noStore, noCache := "no-store", "no-cache"
	r, _ := ctx.Value(rawRequestKey{}).(*http.Request)
	if r == nil {
		return nil, apierr.Internal(errors.New("machineid: StrictMiddleware is not mounted"))
	}
	g, gerr := ReadGrantRequest(r)
	var tok Token
	var err error
	if gerr == nil {
		tok, err = h.Svc.Grant(ctx, g)
	} else {
		err = gerr
	}
	var ge *GrantError
	switch {
	case err == nil:
		return api.IssueAccessToken200JSONResponse{
			Body:    api.ClientCredentialsTokenResponse{AccessToken: tok.AccessToken, TokenType: api.ClientCredentialsTokenResponseTokenTypeBearer, ExpiresIn: tok.ExpiresIn, Scope: tok.Scope},
			Headers: api.IssueAccessToken200ResponseHeaders{CacheControl: &noStore, Pragma: &noCache},
		}, nil
	case errors.As(err, &ge):
		body := api.OAuthError{Error: api.OAuthErrorError(ge.Code), ErrorDescription: &ge.Description}
		switch ge.Status {
		case http.StatusUnauthorized:
			challenge := `Basic realm="gantry", charset="UTF-8"`
			return api.IssueAccessToken401JSONResponse{Body: body, Headers: api.IssueAccessToken401ResponseHeaders{CacheControl: &noStore, WWWAuthenticate: &challenge}}, nil
		case http.StatusTooManyRequests:
			secs := int((ge.RetryAfter + time.Second - 1) / time.Second)
			return api.IssueAccessToken429JSONResponse{Body: body, Headers: api.IssueAccessToken429ResponseHeaders{CacheControl: &noStore, RetryAfter: &secs}}, nil
		default:
			return api.IssueAccessToken400JSONResponse{Body: body, Headers: api.IssueAccessToken400ResponseHeaders{CacheControl: &noStore}}, nil
		}
	default:
		return nil, err
	}
}
