package apps

import (
	"context"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers is the catalog slice of the strict server: GET /api/v1/apps..., and the
// admin operations under /api/v1/admin/apps. The chain has checked the declared
// requirement (a project role, or platform admin) before any of them runs.
type Handlers struct {
	Svc     *Service
	Cursors pagination.Codec
}

// NewHandlers returns the handlers over svc.
func NewHandlers(svc *Service, cursors pagination.Codec) *Handlers {
	return &Handlers{Svc: svc, Cursors: cursors}
}

const (
	sortApps         = "apps.slug"
	sortEntitlements = "app_entitlements.id"
)

func project(ctx context.Context) (projectctx.Project, error) {
	if _, err := principal.Required(ctx); err != nil {
		return projectctx.Project{}, err
	}
	proj, ok := projectctx.From(ctx)
	if !ok {
		return projectctx.Project{}, apierr.Forbidden("you do not have access to this project")
	}
	return proj, nil
}

// APIApp is the contract's App.
func APIApp(a App) api.App {
	out := api.App{Slug: a.Slug, Name: a.Name, Description: a.Description, Kind: api.V3WorkloadKind(a.Kind),
		Deprecated: a.DeprecatedAt != nil, DeprecatedAt: a.DeprecatedAt, Entitled: a.Entitled,
		Versions: make([]api.AppVersionSummary, 0, len(a.Versions)), CreatedAt: a.CreatedAt, UpdatedAt: a.UpdatedAt}
	if l := a.Latest(); l != "" {
		out.LatestVersion = &l
	}
	for _, v := range a.Versions {
		out.Versions = append(out.Versions, api.AppVersionSummary{Version: v.Version, Deprecated: v.DeprecatedAt != nil, CreatedAt: v.CreatedAt})
	}
	return out
}

// APIVersion is the contract's AppVersion.
func APIVersion(v Version) api.AppVersion {
	out := api.AppVersion{AppSlug: v.AppSlug, Version: v.Version, Command: v.Command, Port: v.Port,
		Env:         make([]api.AppEnvVar, 0, len(v.Env)),
		HealthCheck: api.AppHealthCheck{Type: api.AppHealthCheckType(v.Health.Type), IntervalSeconds: v.Health.IntervalSeconds, TimeoutSeconds: v.Health.TimeoutSeconds, FailureThreshold: v.Health.FailureThreshold, StartupTimeoutSeconds: v.Health.StartupTimeoutSeconds},
		MinGpuCount: v.MinGPUCount, Placement: api.AppPlacement(v.Placement), BootstrapSSH: v.BootstrapSSH,
		Deprecated: v.DeprecatedAt != nil, DeprecatedAt: v.DeprecatedAt, CreatedAt: v.CreatedAt}
	for _, e := range v.Env {
		out.Env = append(out.Env, api.AppEnvVar{Name: e.Name, Value: e.Value})
	}
	if v.Health.Path != "" {
		p := v.Health.Path
		out.HealthCheck.Path = &p
	}
	if v.GPUModel != "" {
		m := v.GPUModel
		out.GpuModel = &m
	}
	return out
}

func versionOf(spec api.AppVersionSpec) Version {
	v := Version{Version: spec.Version, Command: spec.Command, Port: spec.Port, Health: HealthCheck{Type: string(spec.HealthCheck.Type)}}
	for _, e := range spec.Env {
		v.Env = append(v.Env, EnvVar{Name: e.Name, Value: e.Value})
	}
	h := spec.HealthCheck
	if h.Path != nil {
		v.Health.Path = *h.Path
	}
	for dst, src := range map[*int]*int{&v.Health.IntervalSeconds: h.IntervalSeconds, &v.Health.TimeoutSeconds: h.TimeoutSeconds,
		&v.Health.FailureThreshold: h.FailureThreshold, &v.Health.StartupTimeoutSeconds: h.StartupTimeoutSeconds, &v.MinGPUCount: spec.MinGpuCount} {
		if src != nil {
			*dst = *src
		}
	}
	if spec.GpuModel != nil {
		v.GPUModel = *spec.GpuModel
	}
	if spec.Placement != nil {
		v.Placement = string(*spec.Placement)
	}
	if spec.BootstrapSSH != nil {
		v.BootstrapSSH = *spec.BootstrapSSH
	}
	return v
}

func (h *Handlers) list(ctx context.Context, tenant uuid.UUID, cursor *string, pageSize *int) (api.AppListResponse, error) {
	sort := sortApps + ":" + tenant.String()
	var after string
	if err := h.Cursors.DecodeAfter(cursor, sort, &after); err != nil {
		return api.AppListResponse{}, err
	}
	size := pagination.Size(pageSize)
	items, more, err := h.Svc.ListApps(ctx, tenant, after, size)
	if err != nil {
		return api.AppListResponse{}, err
	}
	out := api.AppListResponse{Items: make([]api.App, 0, len(items)), Pagination: api.Pagination{PageSize: size}}
	for _, a := range items {
		out.Items = append(out.Items, APIApp(a))
	}
	if more {
		if out.Pagination.NextCursor, err = h.Cursors.Next(true, sort, items[len(items)-1].Slug); err != nil {
			return api.AppListResponse{}, err
		}
	}
	return out, nil
}

// ListApps implements GET /api/v1/apps: entitled for the project's tenant.
func (h *Handlers) ListApps(ctx context.Context, req api.ListAppsRequestObject) (api.ListAppsResponseObject, error) {
	proj, err := project(ctx)
	if err != nil {
		return nil, err
	}
	out, err := h.list(ctx, proj.TenantID, req.Params.Cursor, req.Params.PageSize)
	if err != nil {
		return nil, err
	}
	return api.ListApps200JSONResponse{Body: out}, nil
}

// GetAppVersion implements GET /api/v1/apps/{app_slug}/versions/{version}.
func (h *Handlers) GetAppVersion(ctx context.Context, req api.GetAppVersionRequestObject) (api.GetAppVersionResponseObject, error) {
	if _, err := project(ctx); err != nil {
		return nil, err
	}
	v, err := h.Svc.GetVersion(ctx, req.AppSlug, req.Version)
	if err != nil {
		return nil, err
	}
	return api.GetAppVersion200JSONResponse{Body: APIVersion(v)}, nil
}

// ListAdminApps implements GET /api/v1/admin/apps.
func (h *Handlers) ListAdminApps(ctx context.Context, req api.ListAdminAppsRequestObject) (api.ListAdminAppsResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	out, err := h.list(ctx, uuid.Nil, req.Params.Cursor, req.Params.PageSize)
	if err != nil {
		return nil, err
	}
	return api.ListAdminApps200JSONResponse{Body: out}, nil
}

// CreateApp implements POST /api/v1/admin/apps.
func (h *Handlers) CreateApp(ctx context.Context, req api.CreateAppRequestObject) (api.CreateAppResponseObject, error) {
	p, err := principal.PlatformAdmin(ctx)
	if err != nil {
		return nil, err
	}
	if req.Body == nil {
		return nil, apierr.Validation("body", "a body is required")
	}
	in := NewApp{Slug: req.Body.Slug, Name: req.Body.Name, Kind: string(req.Body.Kind)}
	if req.Body.Description != nil {
		in.Description = *req.Body.Description
	}
	for _, spec := range req.Body.Versions {
		in.Versions = append(in.Versions, versionOf(spec))
	}
	a, err := h.Svc.CreateApp(ctx, p.UserID, in)
	if err != nil {
		return nil, err
	}
	return api.CreateApp201JSONResponse{Body: APIApp(a)}, nil
}

// UpdateApp implements PATCH /api/v1/admin/apps/{app_slug}.
func (h *Handlers) UpdateApp(ctx context.Context, req api.UpdateAppRequestObject) (api.UpdateAppResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	if req.Body == nil {
		return nil, apierr.Validation("body", "a body is required")
	}
	c := AppChange{Name: req.Body.Name, Description: req.Body.Description, Deprecated: req.Body.Deprecated}
	if req.Body.Kind != nil {
		k := string(*req.Body.Kind)
		c.Kind = &k
	}
	a, err := h.Svc.UpdateApp(ctx, req.AppSlug, c)
	if err != nil {
		return nil, err
	}
	return api.UpdateApp200JSONResponse{Body: APIApp(a)}, nil
}

// CreateAppVersion implements POST /api/v1/admin/apps/{app_slug}/versions.
func (h *Handlers) CreateAppVersion(ctx context.Context, req api.CreateAppVersionRequestObject) (api.CreateAppVersionResponseObject, error) {
	p, err := principal.PlatformAdmin(ctx)
	if err != nil {
		return nil, err
	}
	if req.Body == nil {
		return nil, apierr.Validation("body", "a body is required")
	}
	v, err := h.Svc.CreateVersion(ctx, p.UserID, req.AppSlug, versionOf(*req.Body))
	if err != nil {
		return nil, err
	}
	return api.CreateAppVersion201JSONResponse{Body: APIVersion(v)}, nil
}

// UpdateAppVersion implements PATCH /api/v1/admin/apps/{app_slug}/versions/{version}.
func (h *Handlers) UpdateAppVersion(ctx context.Context, req api.UpdateAppVersionRequestObject) (api.UpdateAppVersionResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	if req.Body == nil {
		return nil, apierr.Validation("body", "a body is required")
	}
	v, err := h.Svc.SetVersionDeprecated(ctx, req.AppSlug, req.Version, req.Body.Deprecated)
	if err != nil {
		return nil, err
	}
	return api.UpdateAppVersion200JSONResponse{Body: APIVersion(v)}, nil
}

func apiEntitlement(e Entitlement) api.AppEntitlement {
	out := api.AppEntitlement{ID: e.ID, AppSlug: e.AppSlug, CreatedByUserID: e.CreatedBy, CreatedAt: e.CreatedAt}
	if e.TenantID != uuid.Nil {
		t := e.TenantID
		out.TenantID = &t
	}
	return out
}

// ListAppEntitlements implements GET /api/v1/admin/apps/{app_slug}/entitlements.
func (h *Handlers) ListAppEntitlements(ctx context.Context, req api.ListAppEntitlementsRequestObject) (api.ListAppEntitlementsResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	sort := sortEntitlements + ":" + req.AppSlug
	var after uuid.UUID
	if err := h.Cursors.DecodeAfter(req.Params.Cursor, sort, &after); err != nil {
		return nil, err
	}
	size := pagination.Size(req.Params.PageSize)
	items, more, err := h.Svc.ListEntitlements(ctx, req.AppSlug, after, size)
	if err != nil {
		return nil, err
	}
	out := api.AppEntitlementListResponse{Items: make([]api.AppEntitlement, 0, len(items)), Pagination: api.Pagination{PageSize: size}}
	for _, e := range items {
		out.Items = append(out.Items, apiEntitlement(e))
	}
	if more {
		if out.Pagination.NextCursor, err = h.Cursors.Next(true, sort, items[len(items)-1].ID); err != nil {
			return nil, err
		}
	}
	return api.ListAppEntitlements200JSONResponse{Body: out}, nil
}

// CreateAppEntitlement implements POST /api/v1/admin/apps/{app_slug}/entitlements.
func (h *Handlers) CreateAppEntitlement(ctx context.Context, req api.CreateAppEntitlementRequestObject) (api.CreateAppEntitlementResponseObject, error) {
	p, err := principal.PlatformAdmin(ctx)
	if err != nil {
		return nil, err
	}
	if req.Body == nil {
		return nil, apierr.Validation("body", "a body is required")
	}
	var tenant uuid.UUID
	if req.Body.TenantID != nil {
		tenant = *req.Body.TenantID
	}
	e, err := h.Svc.Entitle(ctx, p.UserID, req.AppSlug, tenant)
	if err != nil {
		return nil, err
	}
	return api.CreateAppEntitlement201JSONResponse{Body: apiEntitlement(e)}, nil
}

// DeleteAppEntitlement implements DELETE /api/v1/admin/apps/{app_slug}/entitlements/{entitlement_id}.
func (h *Handlers) DeleteAppEntitlement(ctx context.Context, req api.DeleteAppEntitlementRequestObject) (api.DeleteAppEntitlementResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	if err := h.Svc.RemoveEntitlement(ctx, req.AppSlug, req.EntitlementID); err != nil {
		return nil, err
	}
	return api.DeleteAppEntitlement204Response{}, nil
}
