package maas

import (
	"context"

	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/proto/api"
)

// Handlers implements the AdminMaasSites and AdminMaasLifecycle operations.
type Handlers struct {
	Svc     *Service
	Cursors pagination.Codec
}

// NewHandlers returns the handlers over svc.
func NewHandlers(svc *Service, cursors pagination.Codec) *Handlers {
	return &Handlers{Svc: svc, Cursors: cursors}
}

func admin(ctx context.Context) error { _, err := principal.PlatformAdmin(ctx); return err }

func apiSite(st Site) api.MaasSite {
	out := api.MaasSite{ID: st.ID, Name: st.Name, Region: st.Region, APIURL: st.APIURL, TLSVerify: st.TLSVerify, CaBundle: st.CABundle,
		DefaultOsImageID: st.DefaultOSImageID, DefaultPool: st.DefaultPool, DefaultZone: st.DefaultZone, DefaultTags: st.DefaultTags,
		CredentialID: st.CredentialID, PendingCredentialID: st.PendingCredential, LastSyncAt: st.LastSyncAt, MachineCount: st.MachineCount,
		CreatedAt: st.CreatedAt, UpdatedAt: st.UpdatedAt}
	if st.CheckStatus != nil && st.CheckedAt != nil {
		out.LastCheck = &api.MaasSiteCheck{Status: api.MaasSiteCheckStatus(*st.CheckStatus), CheckedAt: *st.CheckedAt, Reason: st.CheckReason}
	}
	return out
}

func apiSteps(steps []Step) []api.MaasWorkflowStep {
	out := make([]api.MaasWorkflowStep, len(steps))
	for i, s := range steps {
		out[i] = api.MaasWorkflowStep{Name: s.Name, State: api.MaasWorkflowStepState(s.State), Attempts: s.Attempts, StartedAt: s.StartedAt,
			FinishedAt: s.FinishedAt, DeadlineAt: s.DeadlineAt, Reason: s.Reason}
	}
	return out
}

func apiOnboarding(o Onboarding) api.MaasOnboarding {
	return api.MaasOnboarding{ID: o.ID, SiteID: o.SiteID, ProfileID: o.ProfileID, SystemID: o.SystemID, Hostname: o.Hostname, NodeID: o.NodeID,
		State: api.MaasWorkflowState(o.State), CurrentStep: o.CurrentStep, FailureReason: o.FailureReason, Steps: apiSteps(o.Steps),
		CreatedAt: o.CreatedAt, UpdatedAt: o.UpdatedAt, FinishedAt: o.FinishedAt}
}

func apiDecommission(d Decommission) api.MaasDecommission {
	return api.MaasDecommission{ID: d.ID, NodeID: d.NodeID, SiteID: d.SiteID, SystemID: d.SystemID, DrainDeadline: d.DrainDeadline,
		Erase: api.MaasDecommissionErase(d.Erase), Reason: d.Reason, State: api.MaasWorkflowState(d.State), CurrentStep: d.CurrentStep,
		FailureReason: d.FailureReason, Steps: apiSteps(d.Steps), CreatedAt: d.CreatedAt, UpdatedAt: d.UpdatedAt, FinishedAt: d.FinishedAt}
}

func apiProfile(p Profile) api.MaasProfile {
	return api.MaasProfile{ID: p.ID, Name: p.Name, OsImageID: p.OSImageID, Osystem: p.OSystem, DistroSeries: p.DistroSeries, HweKernel: p.HWEKernel,
		StorageLayout: api.MaasStorageLayout(p.StorageLayout), AgentRuntime: api.MaasProfileAgentRuntime(p.AgentRuntime), Labels: p.Labels,
		Region: p.Region, Skus: p.SKUs, CreatedAt: p.CreatedAt, UpdatedAt: p.UpdatedAt}
}

func (h *Handlers) page(after *string, more bool, last string, size int) (api.Pagination, error) {
	next, err := h.Cursors.Next(more, "name", last)
	return api.Pagination{NextCursor: next, PageSize: size}, err
}

// ListMaasSites implements GET /api/v1/admin/maas/sites.
func (h *Handlers) ListMaasSites(ctx context.Context, req api.ListMaasSitesRequestObject) (api.ListMaasSitesResponseObject, error) {
	if err := admin(ctx); err != nil {
		return nil, err
	}
	var after string
	if err := h.Cursors.DecodeAfter(req.Params.Cursor, "name", &after); err != nil {
		return nil, err
	}
	size := pagination.Size(req.Params.PageSize)
	sites, more, err := h.Svc.ListSites(ctx, after, size)
	if err != nil {
		return nil, err
	}
	items := make([]api.MaasSite, len(sites))
	last := ""
	for i, st := range sites {
		items[i] = apiSite(st)
		last = st.Name
	}
	pg, err := h.page(req.Params.Cursor, more, last, size)
	if err != nil {
		return nil, err
	}
	return api.ListMaasSites200JSONResponse{Body: api.MaasSiteListResponse{Items: items, Pagination: pg}}, nil
}

// CreateMaasSite implements POST /api/v1/admin/maas/sites.
func (h *Handlers) CreateMaasSite(ctx context.Context, req api.CreateMaasSiteRequestObject) (api.CreateMaasSiteResponseObject, error) {
	if err := admin(ctx); err != nil {
		return nil, err
	}
	b := req.Body
	spec := SiteSpec{Name: b.Name, Region: b.Region, APIURL: b.APIURL, APIKey: b.APIKey, TLSVerify: b.TLSVerify == nil || *b.TLSVerify,
		CABundle: b.CaBundle, DefaultOSImageID: b.DefaultOsImageID, DefaultPool: b.DefaultPool, DefaultZone: b.DefaultZone, DefaultTags: b.DefaultTags}
	st, err := h.Svc.CreateSite(ctx, spec)
	if err != nil {
		return nil, err
	}
	return api.CreateMaasSite201JSONResponse{Body: apiSite(st)}, nil
}

// GetMaasSite implements GET /api/v1/admin/maas/sites/{id}.
func (h *Handlers) GetMaasSite(ctx context.Context, req api.GetMaasSiteRequestObject) (api.GetMaasSiteResponseObject, error) {
	if err := admin(ctx); err != nil {
		return nil, err
	}
	var st Site
	var err error
	if req.Params.Check != nil && *req.Params.Check {
		st, err = h.Svc.CheckSite(ctx, req.ID)
	} else {
		st, err = h.Svc.GetSite(ctx, req.ID)
	}
	if err != nil {
		return nil, err
	}
	return api.GetMaasSite200JSONResponse{Body: apiSite(st)}, nil
}

// UpdateMaasSite implements PATCH /api/v1/admin/maas/sites/{id}.
func (h *Handlers) UpdateMaasSite(ctx context.Context, req api.UpdateMaasSiteRequestObject) (api.UpdateMaasSiteResponseObject, error) {
	if err := admin(ctx); err != nil {
		return nil, err
	}
	b := req.Body
	st, err := h.Svc.UpdateSite(ctx, req.ID, SitePatch{Name: b.Name, Region: b.Region, APIURL: b.APIURL, TLSVerify: b.TLSVerify,
		CABundle: b.CaBundle, DefaultOSImageID: b.DefaultOsImageID, DefaultPool: b.DefaultPool, DefaultZone: b.DefaultZone,
		DefaultTags: b.DefaultTags, SetDefaultTags: b.DefaultTags != nil})
	if err != nil {
		return nil, err
	}
	return api.UpdateMaasSite200JSONResponse{Body: apiSite(st)}, nil
}

// DeleteMaasSite implements DELETE /api/v1/admin/maas/sites/{id}.
func (h *Handlers) DeleteMaasSite(ctx context.Context, req api.DeleteMaasSiteRequestObject) (api.DeleteMaasSiteResponseObject, error) {
	if err := admin(ctx); err != nil {
		return nil, err
	}
	if err := h.Svc.DeleteSite(ctx, req.ID); err != nil {
		return nil, err
	}
	return api.DeleteMaasSite204Response{}, nil
}

// SyncMaasSite implements POST /api/v1/admin/maas/sites/{id}/sync.
func (h *Handlers) SyncMaasSite(ctx context.Context, req api.SyncMaasSiteRequestObject) (api.SyncMaasSiteResponseObject, error) {
	if err := admin(ctx); err != nil {
		return nil, err
	}
	r, err := h.Svc.SyncSite(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	return api.SyncMaasSite200JSONResponse{Body: api.MaasSyncResult{SiteID: r.SiteID, MachineCount: r.MachineCount, Added: r.Added,
		Updated: r.Updated, Removed: r.Removed, SyncedAt: r.SyncedAt}}, nil
}

// ListMaasMachines implements GET /api/v1/admin/maas/sites/{id}/machines.
func (h *Handlers) ListMaasMachines(ctx context.Context, req api.ListMaasMachinesRequestObject) (api.ListMaasMachinesResponseObject, error) {
	if err := admin(ctx); err != nil {
		return nil, err
	}
	var after string
	if err := h.Cursors.DecodeAfter(req.Params.Cursor, "system_id", &after); err != nil {
		return nil, err
	}
	size := pagination.Size(req.Params.PageSize)
	ms, more, err := h.Svc.ListMachines(ctx, req.ID, req.Params.CandidatesOnly != nil && *req.Params.CandidatesOnly, after, size)
	if err != nil {
		return nil, err
	}
	items := make([]api.MaasMachine, len(ms))
	last := ""
	for i, m := range ms {
		gpus := make([]api.MaasMachineGPU, len(m.GPUs))
		for j, g := range m.GPUs {
			gpus[j] = api.MaasMachineGPU{Model: g.Model, Count: g.Count}
		}
		items[i] = api.MaasMachine{SiteID: m.SiteID, SystemID: m.SystemID, Hostname: m.Hostname, Status: m.Status, StatusName: m.StatusName,
			PowerState: m.PowerState, Pool: m.Pool, Zone: m.Zone, Tags: m.Tags, CPUCount: m.CPUCount, MemoryMib: m.MemoryMiB, Gpus: gpus,
			SkuCandidates: m.SKUCandidates, OnboardingID: m.OnboardingID, NodeID: m.NodeID, SyncedAt: m.SyncedAt}
		last = m.SystemID
	}
	next, err := h.Cursors.Next(more, "system_id", last)
	if err != nil {
		return nil, err
	}
	return api.ListMaasMachines200JSONResponse{Body: api.MaasMachineListResponse{Items: items, Pagination: api.Pagination{NextCursor: next, PageSize: size}}}, nil
}

// RotateMaasSiteCredential implements POST /api/v1/admin/maas/sites/{id}/credentials.
func (h *Handlers) RotateMaasSiteCredential(ctx context.Context, req api.RotateMaasSiteCredentialRequestObject) (api.RotateMaasSiteCredentialResponseObject, error) {
	if err := admin(ctx); err != nil {
		return nil, err
	}
	c, err := h.Svc.RotateCredential(ctx, req.ID, req.Body.APIKey)
	if err != nil {
		return nil, err
	}
	return api.RotateMaasSiteCredential201JSONResponse{Body: api.MaasCredential{CredentialID: c.ID, SiteID: c.SiteID,
		State: api.MaasCredentialState(c.State), CreatedAt: c.CreatedAt, VerifiedAt: c.VerifiedAt, RetiredAt: c.RetiredAt}}, nil
}

// CreateMaasOnboarding implements POST /api/v1/admin/maas/sites/{id}/onboardings.
func (h *Handlers) CreateMaasOnboarding(ctx context.Context, req api.CreateMaasOnboardingRequestObject) (api.CreateMaasOnboardingResponseObject, error) {
	if err := admin(ctx); err != nil {
		return nil, err
	}
	b := req.Body
	spec := OnboardingSpec{SiteID: req.ID, ProfileID: b.ProfileID, SystemID: b.SystemID, NodeName: b.NodeName}
	if c := b.Constraints; c != nil {
		spec.Constraints = &Constraints{Tags: c.Tags, NotTags: c.NotTags, Pool: deref(c.Pool), Zone: deref(c.Zone)}
		if c.CPUCount != nil {
			spec.Constraints.CPUCount = *c.CPUCount
		}
		if c.MemoryMib != nil {
			spec.Constraints.MemoryMiB = *c.MemoryMib
		}
	}
	o, err := h.Svc.CreateOnboarding(ctx, spec)
	if err != nil {
		return nil, err
	}
	return api.CreateMaasOnboarding202JSONResponse{Body: apiOnboarding(o)}, nil
}

// GetMaasOnboarding implements GET /api/v1/admin/maas/onboardings/{onboarding_id}.
func (h *Handlers) GetMaasOnboarding(ctx context.Context, req api.GetMaasOnboardingRequestObject) (api.GetMaasOnboardingResponseObject, error) {
	if err := admin(ctx); err != nil {
		return nil, err
	}
	o, err := h.Svc.GetOnboarding(ctx, req.OnboardingID)
	if err != nil {
		return nil, err
	}
	return api.GetMaasOnboarding200JSONResponse{Body: apiOnboarding(o)}, nil
}

// RetryMaasOnboarding implements POST .../onboardings/{onboarding_id}/retry.
func (h *Handlers) RetryMaasOnboarding(ctx context.Context, req api.RetryMaasOnboardingRequestObject) (api.RetryMaasOnboardingResponseObject, error) {
	if err := admin(ctx); err != nil {
		return nil, err
	}
	o, err := h.Svc.RetryOnboarding(ctx, req.OnboardingID)
	if err != nil {
		return nil, err
	}
	return api.RetryMaasOnboarding202JSONResponse{Body: apiOnboarding(o)}, nil
}

// AbortMaasOnboarding implements POST .../onboardings/{onboarding_id}/abort.
func (h *Handlers) AbortMaasOnboarding(ctx context.Context, req api.AbortMaasOnboardingRequestObject) (api.AbortMaasOnboardingResponseObject, error) {
	if err := admin(ctx); err != nil {
		return nil, err
	}
	o, err := h.Svc.AbortOnboarding(ctx, req.OnboardingID)
	if err != nil {
		return nil, err
	}
	return api.AbortMaasOnboarding202JSONResponse{Body: apiOnboarding(o)}, nil
}

// ListMaasProfiles implements GET /api/v1/admin/maas/profiles.
func (h *Handlers) ListMaasProfiles(ctx context.Context, req api.ListMaasProfilesRequestObject) (api.ListMaasProfilesResponseObject, error) {
	if err := admin(ctx); err != nil {
		return nil, err
	}
	var after string
	if err := h.Cursors.DecodeAfter(req.Params.Cursor, "name", &after); err != nil {
		return nil, err
	}
	size := pagination.Size(req.Params.PageSize)
	ps, more, err := h.Svc.ListProfiles(ctx, after, size)
	if err != nil {
		return nil, err
	}
	items := make([]api.MaasProfile, len(ps))
	last := ""
	for i, p := range ps {
		items[i] = apiProfile(p)
		last = p.Name
	}
	pg, err := h.page(req.Params.Cursor, more, last, size)
	if err != nil {
		return nil, err
	}
	return api.ListMaasProfiles200JSONResponse{Body: api.MaasProfileListResponse{Items: items, Pagination: pg}}, nil
}

// CreateMaasProfile implements POST /api/v1/admin/maas/profiles.
func (h *Handlers) CreateMaasProfile(ctx context.Context, req api.CreateMaasProfileRequestObject) (api.CreateMaasProfileResponseObject, error) {
	if err := admin(ctx); err != nil {
		return nil, err
	}
	b := req.Body
	spec := ProfileSpec{Name: &b.Name, OSImageID: &b.OsImageID, DistroSeries: b.DistroSeries, HWEKernel: b.HweKernel, Labels: b.Labels,
		Region: b.Region, SKUs: b.Skus}
	if b.StorageLayout != nil {
		l := string(*b.StorageLayout)
		spec.StorageLayout = &l
	}
	p, err := h.Svc.CreateProfile(ctx, spec)
	if err != nil {
		return nil, err
	}
	return api.CreateMaasProfile201JSONResponse{Body: apiProfile(p)}, nil
}

// GetMaasProfile implements GET /api/v1/admin/maas/profiles/{profile_id}.
func (h *Handlers) GetMaasProfile(ctx context.Context, req api.GetMaasProfileRequestObject) (api.GetMaasProfileResponseObject, error) {
	if err := admin(ctx); err != nil {
		return nil, err
	}
	p, err := h.Svc.GetProfile(ctx, req.ProfileID)
	if err != nil {
		return nil, err
	}
	return api.GetMaasProfile200JSONResponse{Body: apiProfile(p)}, nil
}

// UpdateMaasProfile implements PATCH /api/v1/admin/maas/profiles/{profile_id}.
func (h *Handlers) UpdateMaasProfile(ctx context.Context, req api.UpdateMaasProfileRequestObject) (api.UpdateMaasProfileResponseObject, error) {
	if err := admin(ctx); err != nil {
		return nil, err
	}
	b := req.Body
	spec := ProfileSpec{Name: b.Name, OSImageID: b.OsImageID, DistroSeries: b.DistroSeries, HWEKernel: b.HweKernel, Labels: b.Labels,
		SetLabels: b.Labels != nil, Region: b.Region, SKUs: b.Skus}
	if b.StorageLayout != nil {
		l := string(*b.StorageLayout)
		spec.StorageLayout = &l
	}
	p, err := h.Svc.UpdateProfile(ctx, req.ProfileID, spec)
	if err != nil {
		return nil, err
	}
	return api.UpdateMaasProfile200JSONResponse{Body: apiProfile(p)}, nil
}

// DeleteMaasProfile implements DELETE /api/v1/admin/maas/profiles/{profile_id}.
func (h *Handlers) DeleteMaasProfile(ctx context.Context, req api.DeleteMaasProfileRequestObject) (api.DeleteMaasProfileResponseObject, error) {
	if err := admin(ctx); err != nil {
		return nil, err
	}
	if err := h.Svc.DeleteProfile(ctx, req.ProfileID); err != nil {
		return nil, err
	}
	return api.DeleteMaasProfile204Response{}, nil
}

// CreateNodeDecommission implements POST /api/v1/admin/nodes/{node_id}/decommissions.
func (h *Handlers) CreateNodeDecommission(ctx context.Context, req api.CreateNodeDecommissionRequestObject) (api.CreateNodeDecommissionResponseObject, error) {
	if err := admin(ctx); err != nil {
		return nil, err
	}
	b := req.Body
	spec := DecommissionSpec{NodeID: req.NodeID, DrainDeadline: b.DrainDeadline, Reason: b.Reason}
	if b.Erase != nil {
		spec.Erase = string(*b.Erase)
	}
	d, err := h.Svc.CreateDecommission(ctx, spec)
	if err != nil {
		return nil, err
	}
	return api.CreateNodeDecommission202JSONResponse{Body: apiDecommission(d)}, nil
}

// GetMaasDecommission implements GET /api/v1/admin/maas/decommissions/{decommission_id}.
func (h *Handlers) GetMaasDecommission(ctx context.Context, req api.GetMaasDecommissionRequestObject) (api.GetMaasDecommissionResponseObject, error) {
	if err := admin(ctx); err != nil {
		return nil, err
	}
	d, err := h.Svc.GetDecommission(ctx, req.DecommissionID)
	if err != nil {
		return nil, err
	}
	return api.GetMaasDecommission200JSONResponse{Body: apiDecommission(d)}, nil
}
