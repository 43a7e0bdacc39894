package instances

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances/lifecycle"
	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers implements the app instance operations of api.StrictServerInterface
// (listAppInstances, createAppInstance, getAppInstance, deleteAppInstance). Every
// operation acts in the project of X-Project-ID; another project's instance is
// app_instance_not_found.
type Handlers struct {
	Svc     *Service
	Cursors pagination.Codec
}

// NewHandlers returns the handlers over svc.
func NewHandlers(svc *Service, cursors pagination.Codec) *Handlers {
	return &Handlers{Svc: svc, Cursors: cursors}
}

const sortInstances = "app_instances.id"

func scope(ctx context.Context) (*principal.Principal, projectctx.Project, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, projectctx.Project{}, err
	}
	proj, ok := projectctx.From(ctx)
	if !ok {
		return nil, projectctx.Project{}, apierr.New(apierr.InvalidRequest, "project context is required: send the X-Project-ID header").
			With("field", "X-Project-ID").With("reason", "project_context_missing")
	}
	return p, proj, nil
}

// BootstrapStates is the bootstrap SSH state of each instance (api.AppBootstrapSSHState):
// not_required (the version needs none, or a revoke went through: nothing is trusted),
// pending (its task is out), trusted (the node trusts the keys) or failed.
func (s *Service) BootstrapStates(ctx context.Context, is []Instance) (map[uuid.UUID]string, error) {
	out := make(map[uuid.UUID]string, len(is))
	var ids []uuid.UUID
	for _, i := range is {
		out[i.ID] = "not_required"
		if i.BootstrapSSH {
			ids = append(ids, i.ID)
			out[i.ID] = "pending"
		}
	}
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := s.q(ctx).Query(ctx, `SELECT st.instance_id, st.requested_state, t.finished_at IS NOT NULL, coalesce(t.succeeded, false)
		FROM app_instance_ssh_trust st JOIN app_instance_tasks t ON t.task_id = st.task_id WHERE st.instance_id = ANY($1)`, ids)
	if err != nil {
		return nil, fmt.Errorf("bootstrap ssh states: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id uuid.UUID
		var requested string
		var finished, ok bool
		if err := rows.Scan(&id, &requested, &finished, &ok); err != nil {
			return nil, fmt.Errorf("bootstrap ssh states: %w", err)
		}
		switch {
		case finished && ok && requested == TrustRevoked:
			out[id] = "not_required"
		case finished && ok:
			out[id] = "trusted"
		case finished:
			out[id] = "failed"
		}
	}
	return out, rows.Err()
}

// APIInstance is the contract's view of an instance.
func APIInstance(i Instance, bootstrap string) api.AppInstance {
	var spec RunSpec
	_ = json.Unmarshal(i.RunSpec, &spec) // written by Launch; a kind it lacks shows as app
	kind := api.V3WorkloadKind(spec.Kind)
	if !kind.Valid() {
		kind = api.V3WorkloadKindApp
	}
	nodeID := i.NodeID
	out := api.AppInstance{
		ID: i.ID, TenantID: i.TenantID, ProjectID: i.ProjectID, AppSlug: i.AppSlug, AppName: i.AppName, Kind: kind,
		Version: i.AppVersion, Name: i.Name, AllocationID: i.AllocationID, AllocationLaunched: i.AllocationCreated,
		NodeID: &nodeID, State: api.AppInstanceState(i.State), StateReason: i.StateReason, RestartCount: int32(min(i.RestartCount, 1<<31-1)),
		Port: i.Port, BootstrapSSH: api.AppBootstrapSSHState(bootstrap), ArtifactIds: i.ArtifactIDs, ProxyPath: BasePath(i.ID),
		CreatedByUserID: i.OwnerUserID, CreatedAt: i.CreatedAt, UpdatedAt: i.UpdatedAt, RunningAt: i.RunningAt, EndedAt: i.EndedAt,
		LastReportAt: i.LastReportAt,
	}
	if out.ArtifactIds == nil {
		out.ArtifactIds = []uuid.UUID{}
	}
	if i.SharedRuntimeID.Valid {
		out.SharedRuntimeID = &i.SharedRuntimeID.UUID
	}
	// The contract: the reason says why an instance is failed, unhealthy or stopping;
	// null otherwise (the audit rows keep every reason).
	if i.State != lifecycle.Failed && i.State != lifecycle.Unhealthy && i.State != lifecycle.Stopping {
		out.StateReason = nil
	}
	return out
}

func (h *Handlers) views(ctx context.Context, is []Instance) ([]api.AppInstance, error) {
	states, err := h.Svc.BootstrapStates(ctx, is)
	if err != nil {
		return nil, err
	}
	out := make([]api.AppInstance, 0, len(is))
	for _, i := range is {
		out = append(out, APIInstance(i, states[i.ID]))
	}
	return out, nil
}

func (h *Handlers) view(ctx context.Context, i Instance) (api.AppInstance, error) {
	v, err := h.views(ctx, []Instance{i})
	if err != nil {
		return api.AppInstance{}, err
	}
	return v[0], nil
}

// ListAppInstances implements GET /api/v1/app-instances.
func (h *Handlers) ListAppInstances(ctx context.Context, req api.ListAppInstancesRequestObject) (api.ListAppInstancesResponseObject, error) {
	_, proj, err := scope(ctx)
	if err != nil {
		return nil, err
	}
	var after uuid.UUID
	if err := h.Cursors.DecodeAfter(req.Params.Cursor, sortInstances, &after); err != nil {
		return nil, err
	}
	size := pagination.Size(req.Params.PageSize)
	pg, err := h.Svc.List(ctx, proj.ID, after, size)
	if err != nil {
		return nil, err
	}
	items, err := h.views(ctx, pg.Items)
	if err != nil {
		return nil, err
	}
	last := uuid.Nil
	if n := len(pg.Items); n > 0 {
		last = pg.Items[n-1].ID
	}
	next, err := h.Cursors.Next(pg.More, sortInstances, last)
	if err != nil {
		return nil, err
	}
	return api.ListAppInstances200JSONResponse{Body: api.AppInstanceListResponse{
		Items: items, Pagination: api.Pagination{PageSize: size, NextCursor: next},
	}}, nil
}

// CreateAppInstance implements POST /api/v1/app-instances.
func (h *Handlers) CreateAppInstance(ctx context.Context, req api.CreateAppInstanceRequestObject) (api.CreateAppInstanceResponseObject, error) {
	p, proj, err := scope(ctx)
	if err != nil {
		return nil, err
	}
	b := req.Body
	spec := LaunchSpec{Name: b.Name, AppSlug: b.AppSlug, Version: b.Version, KeyIDs: b.SSHKeyIds, ArtifactIDs: b.ArtifactIds}
	if b.AllocationID != nil {
		spec.AllocationID = uuid.NullUUID{UUID: *b.AllocationID, Valid: true}
	}
	if b.Sku != nil {
		spec.SKU = *b.Sku
		if spec.SKU == "" {
			return nil, apierr.Validation("sku", "sku must not be empty").With("reason", "length")
		}
	}
	if b.RegionCode != nil {
		spec.Region = *b.RegionCode
	}
	if b.OsImageID != nil {
		spec.OSImageID = uuid.NullUUID{UUID: *b.OsImageID, Valid: true}
	}
	i, err := h.Svc.Launch(ctx, p, proj, spec)
	if err != nil {
		return nil, err
	}
	v, err := h.view(ctx, i)
	if err != nil {
		return nil, err
	}
	return api.CreateAppInstance201JSONResponse{Body: v}, nil
}

// GetAppInstance implements GET /api/v1/app-instances/{app_instance_id}.
func (h *Handlers) GetAppInstance(ctx context.Context, req api.GetAppInstanceRequestObject) (api.GetAppInstanceResponseObject, error) {
	_, proj, err := scope(ctx)
	if err != nil {
		return nil, err
	}
	i, err := h.Svc.Get(ctx, proj.ID, req.AppInstanceID)
	if err != nil {
		return nil, err
	}
	v, err := h.view(ctx, i)
	if err != nil {
		return nil, err
	}
	return api.GetAppInstance200JSONResponse{Body: v}, nil
}

// DeleteAppInstance implements DELETE /api/v1/app-instances/{app_instance_id}.
func (h *Handlers) DeleteAppInstance(ctx context.Context, req api.DeleteAppInstanceRequestObject) (api.DeleteAppInstanceResponseObject, error) {
	p, proj, err := scope(ctx)
	if err != nil {
		return nil, err
	}
	i, err := h.Svc.Stop(ctx, p, proj, req.AppInstanceID)
	if err != nil {
		return nil, err
	}
	v, err := h.view(ctx, i)
	if err != nil {
		return nil, err
	}
	return api.DeleteAppInstance202JSONResponse{Body: v}, nil
}
