package allocations

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers implements the Allocations slice of api.StrictServerInterface. Every
// operation acts in the project of X-Project-ID (set by the project-context
// middleware); an allocation of another project is allocation_not_found.
type Handlers struct {
	Svc     *Service
	Cursors pagination.Codec
}

// NewHandlers returns the handlers over svc.
func NewHandlers(svc *Service, cursors pagination.Codec) *Handlers {
	return &Handlers{Svc: svc, Cursors: cursors}
}

const (
	sortAllocations = "allocations.id"
	sortEvents      = "allocation_events.id"
)

func scope(ctx context.Context) (*principal.Principal, projectctx.Project, error) {
	p, ok := principal.From(ctx)
	if !ok {
		return nil, projectctx.Project{}, apierr.New(apierr.TokenMissing, "authentication required")
	}
	proj, ok := projectctx.From(ctx)
	if !ok {
		return nil, projectctx.Project{}, apierr.New(apierr.InvalidRequest, "project context is required: send the X-Project-ID header").
			With("field", "X-Project-ID").With("reason", "project_context_missing")
	}
	return p, proj, nil
}

// APIAllocation is the contract's view of an allocation; accrued is its accrued cost
// (nil: never active, shown as null).
func APIAllocation(a Allocation, accrued *billing.Money) api.Allocation {
	out := api.Allocation{
		ID: a.ID, Name: a.Name, TenantID: a.TenantID, ProjectID: a.ProjectID, OwnerUserID: a.OwnerUserID, Sku: a.Sku,
		GpuModel: a.GpuModel, GpuCount: int(a.GpuCount), RegionCode: a.RegionCode, NodeID: a.NodeID,
		Status: api.V3WorkloadStatus(a.Status), StatusReason: a.StatusReason, SSHKeyIds: a.SshKeyIds,
		CreatedAt: a.CreatedAt, UpdatedAt: a.UpdatedAt, ActiveAt: a.ActiveAt, EndedAt: a.EndedAt,
	}
	if out.SSHKeyIds == nil {
		out.SSHKeyIds = []uuid.UUID{}
	}
	if a.OsImageID.Valid {
		out.OsImageID = &a.OsImageID.UUID
	}
	if a.ConnectionHost != nil && a.ConnectionPort.Valid && a.ConnectionUser != nil {
		out.Connection = &api.AllocationConnection{Host: *a.ConnectionHost, Port: int(a.ConnectionPort.Int32), User: *a.ConnectionUser}
		// The node's own address is reachable only where the node is; the ProxyCommand
		// reaches the allocation through the node's tunnel from anywhere (docs/ssh.md).
		proxy := ProxyCommand(a.ProjectID, a.ID)
		cmd := fmt.Sprintf("ssh -o ProxyCommand=%q %s@%s", proxy, *a.ConnectionUser, a.ID)
		out.Connection.ProxyCommand, out.Connection.SSHCommand = &proxy, &cmd
	}
	if a.HourlyRateMinor.Valid && a.Currency != nil {
		out.HourlyRate = &api.Money{AmountMinor: a.HourlyRateMinor.Int64, Currency: *a.Currency}
	}
	if accrued != nil {
		out.AccruedCost = &api.Money{AmountMinor: accrued.AmountMinor, Currency: accrued.Currency}
	}
	if a.GroupID.Valid {
		out.AllocationGroupID = &a.GroupID.UUID
	}
	return out
}

// views is the contract's view of allocations, with their accrued costs read at once.
func (h *Handlers) views(ctx context.Context, as []Allocation) ([]api.Allocation, error) {
	costs, err := h.Svc.AccruedCosts(ctx, as)
	if err != nil {
		return nil, err
	}
	out := make([]api.Allocation, 0, len(as))
	for _, a := range as {
		var c *billing.Money
		if m, ok := costs[a.ID]; ok {
			c = &m
		}
		out = append(out, APIAllocation(a, c))
	}
	return out, nil
}

// view is views of one allocation.
func (h *Handlers) view(ctx context.Context, a Allocation) (api.Allocation, error) {
	v, err := h.views(ctx, []Allocation{a})
	if err != nil {
		return api.Allocation{}, err
	}
	return v[0], nil
}

func apiEvent(e Event) api.AllocationEvent {
	out := api.AllocationEvent{
		ID: e.ID, AllocationID: e.AllocationID, ToStatus: api.V3WorkloadStatus(e.ToStatus), Event: e.Event,
		Reason: e.Reason, ActorType: api.AllocationEventActorType(e.ActorType), ActorID: e.ActorID,
		CorrelationID: e.CorrelationID, CreatedAt: e.CreatedAt,
	}
	if e.FromStatus != nil {
		out.FromStatus = ptr(api.V3WorkloadStatus(*e.FromStatus))
	}
	return out
}

func (h *Handlers) cursor(c *string, sort string) (uuid.UUID, error) {
	var after uuid.UUID
	err := h.Cursors.DecodeAfter(c, sort, &after)
	return after, err
}

func allocationID(a Allocation) uuid.UUID { return a.ID }

// nextPage is pg's pagination: its size, and the cursor after its last item's id.
func nextPage[T any](h *Handlers, pg Page[T], id func(T) uuid.UUID, sort string, size int) (api.Pagination, error) {
	last := uuid.Nil
	if n := len(pg.Items); n > 0 {
		last = id(pg.Items[n-1])
	}
	next, err := h.Cursors.Next(pg.More, sort, last)
	return api.Pagination{PageSize: size, NextCursor: next}, err
}

// ListAllocations implements GET /api/v1/allocations.
func (h *Handlers) ListAllocations(ctx context.Context, req api.ListAllocationsRequestObject) (api.ListAllocationsResponseObject, error) {
	_, proj, err := scope(ctx)
	if err != nil {
		return nil, err
	}
	after, err := h.cursor(req.Params.Cursor, sortAllocations)
	if err != nil {
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
	out := api.AllocationListResponse{Items: items}
	if out.Pagination, err = nextPage(h, pg, allocationID, sortAllocations, size); err != nil {
		return nil, err
	}
	return api.ListAllocations200JSONResponse{Body: out}, nil
}

// CreateAllocation implements POST /api/v1/allocations.
func (h *Handlers) CreateAllocation(ctx context.Context, req api.CreateAllocationRequestObject) (api.CreateAllocationResponseObject, error) {
	p, proj, err := scope(ctx)
	if err != nil {
		return nil, err
	}
	b := req.Body
	spec := CreateSpec{Name: b.Name, SKU: b.Sku, KeyIDs: b.SSHKeyIds}
	if b.RegionCode != nil {
		spec.Region = *b.RegionCode
	}
	if b.OsImageID != nil {
		spec.OSImageID = uuid.NullUUID{UUID: *b.OsImageID, Valid: true}
	}
	spec.Attachments = attachmentSpecs(b.StorageAttachments)
	a, err := h.Svc.Create(ctx, p, proj, spec)
	if err != nil {
		return nil, err
	}
	v, err := h.view(ctx, a)
	if err != nil {
		return nil, err
	}
	return api.CreateAllocation201JSONResponse{Body: v}, nil
}

// attachmentSpecs is a launch's storage_attachments (single create and group create).
func attachmentSpecs(in []api.CreateStorageAttachmentRequest) []AttachmentSpec {
	var out []AttachmentSpec
	for _, sa := range in {
		as := AttachmentSpec{BucketID: sa.BucketID, Mode: string(sa.Mode)}
		if sa.BucketProjectID != nil {
			as.BucketProject = *sa.BucketProjectID
		}
		if sa.MountPath != nil {
			as.MountPath = *sa.MountPath
		}
		out = append(out, as)
	}
	return out
}

// GetAllocation implements GET /api/v1/allocations/{allocation_id}.
func (h *Handlers) GetAllocation(ctx context.Context, req api.GetAllocationRequestObject) (api.GetAllocationResponseObject, error) {
	_, proj, err := scope(ctx)
	if err != nil {
		return nil, err
	}
	a, err := h.Svc.Get(ctx, proj.ID, req.AllocationID)
	if err != nil {
		return nil, err
	}
	v, err := h.view(ctx, a)
	if err != nil {
		return nil, err
	}
	return api.GetAllocation200JSONResponse{Body: v}, nil
}

// ListAllocationEvents implements GET /api/v1/allocations/{allocation_id}/events.
func (h *Handlers) ListAllocationEvents(ctx context.Context, req api.ListAllocationEventsRequestObject) (api.ListAllocationEventsResponseObject, error) {
	_, proj, err := scope(ctx)
	if err != nil {
		return nil, err
	}
	after, err := h.cursor(req.Params.Cursor, sortEvents)
	if err != nil {
		return nil, err
	}
	size := pagination.Size(req.Params.PageSize)
	pg, err := h.Svc.Events(ctx, proj.ID, req.AllocationID, after, size)
	if err != nil {
		return nil, err
	}
	out := api.AllocationEventListResponse{Items: make([]api.AllocationEvent, 0, len(pg.Items))}
	for _, e := range pg.Items {
		out.Items = append(out.Items, apiEvent(e))
	}
	if out.Pagination, err = nextPage(h, pg, func(e Event) uuid.UUID { return e.ID }, sortEvents, size); err != nil {
		return nil, err
	}
	return api.ListAllocationEvents200JSONResponse{Body: out}, nil
}

// ReleaseAllocation implements POST /api/v1/allocations/{allocation_id}/release.
func (h *Handlers) ReleaseAllocation(ctx context.Context, req api.ReleaseAllocationRequestObject) (api.ReleaseAllocationResponseObject, error) {
	p, proj, err := scope(ctx)
	if err != nil {
		return nil, err
	}
	a, err := h.Svc.Release(ctx, p, proj, req.AllocationID)
	if err != nil {
		return nil, err
	}
	v, err := h.view(ctx, a)
	if err != nil {
		return nil, err
	}
	return api.ReleaseAllocation200JSONResponse{Body: v}, nil
}

// ListAdminAllocations implements GET /api/v1/admin/allocations.
func (h *Handlers) ListAdminAllocations(ctx context.Context, req api.ListAdminAllocationsRequestObject) (api.ListAdminAllocationsResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	after, err := h.cursor(req.Params.Cursor, sortAllocations)
	if err != nil {
		return nil, err
	}
	var tenant uuid.NullUUID
	if req.Params.TenantID != nil {
		tenant = uuid.NullUUID{UUID: *req.Params.TenantID, Valid: true}
	}
	var status *string
	if req.Params.Status != nil {
		status = ptr(string(*req.Params.Status))
	}
	size := pagination.Size(req.Params.PageSize)
	pg, err := h.Svc.AdminList(ctx, tenant, status, after, size)
	if err != nil {
		return nil, err
	}
	items, err := h.views(ctx, pg.Items)
	if err != nil {
		return nil, err
	}
	out := api.AllocationListResponse{Items: items}
	if out.Pagination, err = nextPage(h, pg, allocationID, sortAllocations, size); err != nil {
		return nil, err
	}
	return api.ListAdminAllocations200JSONResponse{Body: out}, nil
}

// ForceReleaseAllocation implements POST /api/v1/admin/allocations/{allocation_id}/force-release.
func (h *Handlers) ForceReleaseAllocation(ctx context.Context, req api.ForceReleaseAllocationRequestObject) (api.ForceReleaseAllocationResponseObject, error) {
	p, err := principal.PlatformAdmin(ctx)
	if err != nil {
		return nil, err
	}
	a, err := h.Svc.ForceRelease(ctx, p, req.AllocationID)
	if err != nil {
		return nil, err
	}
	v, err := h.view(ctx, a)
	if err != nil {
		return nil, err
	}
	return api.ForceReleaseAllocation200JSONResponse{Body: v}, nil
}

// ProxyCommand is the OpenSSH ProxyCommand that reaches an allocation through the node's
// tunnel: `gantry ssh-proxy` (shared/sshproxy) with the allocation's project.
func ProxyCommand(projectID, allocationID uuid.UUID) string {
	return fmt.Sprintf("gantry ssh-proxy --project %s %s", projectID, allocationID)
}
