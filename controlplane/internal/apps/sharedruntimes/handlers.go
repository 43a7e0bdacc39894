package sharedruntimes

import (
	"context"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers is the shared runtimes slice of the strict server (and the admin create).
type Handlers struct {
	Svc     *Service
	Cursors pagination.Codec
}

// NewHandlers returns the handlers over svc.
func NewHandlers(svc *Service, cursors pagination.Codec) *Handlers {
	return &Handlers{Svc: svc, Cursors: cursors}
}

func callerAndProject(ctx context.Context) (*principal.Principal, projectctx.Project, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, projectctx.Project{}, err
	}
	proj, ok := projectctx.From(ctx)
	if !ok {
		return nil, projectctx.Project{}, apierr.Forbidden("you do not have access to this project")
	}
	return p, proj, nil
}

func apiWorker(w Worker) api.SharedRuntimeWorker {
	out := api.SharedRuntimeWorker{ID: w.ID, SharedRuntimeID: w.RuntimeID, AllocationID: w.AllocationID, State: api.SharedRuntimeWorkerState(w.State),
		StateReason: w.StateReason, LastReportAt: w.LastReportAt, CreatedAt: w.CreatedAt, UpdatedAt: w.UpdatedAt}
	if w.AppInstanceID.Valid {
		id := w.AppInstanceID.UUID
		out.AppInstanceID = &id
	}
	if w.NodeID.Valid {
		id := w.NodeID.UUID
		out.NodeID = &id
	}
	return out
}

func apiRuntime(r Runtime) api.SharedRuntime {
	out := api.SharedRuntime{ID: r.ID, Name: r.Name, AppSlug: r.AppSlug, Version: r.Version, OwnerKind: api.SharedRuntimeOwnerKind(r.OwnerKind),
		OwnerTenantID: r.OwnerTenantID, OwnerProjectID: r.OwnerProjectID, State: api.SharedRuntimeState(r.State()),
		UsageUnit: api.SharedRuntimeUsageUnit(r.UsageUnit), UnitPrice: api.Money{AmountMinor: r.UnitPriceMinor, Currency: r.Currency},
		Attached: r.Attached, Workers: make([]api.SharedRuntimeWorker, 0, len(r.Workers)), CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt}
	for _, w := range r.Workers {
		out.Workers = append(out.Workers, apiWorker(w))
	}
	return out
}

func apiAttachment(a Attachment) api.SharedRuntimeAttachment {
	return api.SharedRuntimeAttachment{ID: a.ID, SharedRuntimeID: a.RuntimeID, ProjectID: a.ProjectID, CreatedByUserID: a.CreatedBy, CreatedAt: a.CreatedAt}
}

func apiWorkerOp(o Operation) api.SharedRuntimeWorkerOperation {
	return api.SharedRuntimeWorkerOperation{ID: o.ID, SharedRuntimeID: o.RuntimeID, WorkerID: o.WorkerID, Kind: api.SharedRuntimeWorkerOperationKind(o.Kind),
		State: api.SharedRuntimeOperationState(o.State), StateReason: o.StateReason, RequestedByUserID: o.RequestedBy,
		CreatedAt: o.CreatedAt, UpdatedAt: o.UpdatedAt, FinishedAt: o.FinishedAt}
}

func apiRepair(o Operation) api.SharedRuntimeRepairOperation {
	ids := o.WorkerIDs
	if ids == nil {
		ids = []uuid.UUID{}
	}
	return api.SharedRuntimeRepairOperation{ID: o.ID, SharedRuntimeID: o.RuntimeID, WorkerIds: ids, Kind: api.SharedRuntimeRepairOperationKind(o.Kind),
		State: api.SharedRuntimeOperationState(o.State), StateReason: o.StateReason, RequestedByUserID: o.RequestedBy,
		CreatedAt: o.CreatedAt, UpdatedAt: o.UpdatedAt, FinishedAt: o.FinishedAt}
}

// page decodes an id cursor bound to sort and returns the page size.
func (h *Handlers) page(cursor *string, size *int, sort string) (uuid.UUID, int, error) {
	var after uuid.UUID
	if err := h.Cursors.DecodeAfter(cursor, sort, &after); err != nil {
		return uuid.Nil, 0, err
	}
	return after, pagination.Size(size), nil
}

func (h *Handlers) next(more bool, sort string, last uuid.UUID) (*string, error) {
	if !more {
		return nil, nil
	}
	return h.Cursors.Next(true, sort, last)
}

// CreateSharedRuntime implements POST /api/v1/admin/shared-runtimes.
func (h *Handlers) CreateSharedRuntime(ctx context.Context, req api.CreateSharedRuntimeRequestObject) (api.CreateSharedRuntimeResponseObject, error) {
	p, err := principal.PlatformAdmin(ctx)
	if err != nil {
		return nil, err
	}
	if req.Body == nil {
		return nil, apierr.Validation("body", "a body is required")
	}
	b := req.Body
	r, err := h.Svc.Create(ctx, p, NewRuntime{Name: b.Name, AppSlug: b.AppSlug, Version: b.Version, OwnerKind: string(b.OwnerKind),
		OwnerProjectID: b.OwnerProjectID, AllocationIDs: b.AllocationIds, UsageUnit: string(b.UsageUnit),
		UnitPriceMinor: b.UnitPrice.AmountMinor, Currency: b.UnitPrice.Currency})
	if err != nil {
		return nil, err
	}
	return api.CreateSharedRuntime201JSONResponse{Body: apiRuntime(r)}, nil
}

// ListSharedRuntimes implements GET /api/v1/shared-runtimes.
func (h *Handlers) ListSharedRuntimes(ctx context.Context, req api.ListSharedRuntimesRequestObject) (api.ListSharedRuntimesResponseObject, error) {
	_, proj, err := callerAndProject(ctx)
	if err != nil {
		return nil, err
	}
	sort := "shared_runtimes.id:" + proj.ID.String()
	after, size, err := h.page(req.Params.Cursor, req.Params.PageSize, sort)
	if err != nil {
		return nil, err
	}
	items, more, err := h.Svc.List(ctx, proj, after, size)
	if err != nil {
		return nil, err
	}
	out := api.SharedRuntimeListResponse{Items: make([]api.SharedRuntime, 0, len(items)), Pagination: api.Pagination{PageSize: size}}
	for _, r := range items {
		out.Items = append(out.Items, apiRuntime(r))
	}
	if len(items) > 0 {
		if out.Pagination.NextCursor, err = h.next(more, sort, items[len(items)-1].ID); err != nil {
			return nil, err
		}
	}
	return api.ListSharedRuntimes200JSONResponse{Body: out}, nil
}

// GetSharedRuntime implements GET /api/v1/shared-runtimes/{shared_runtime_id}.
func (h *Handlers) GetSharedRuntime(ctx context.Context, req api.GetSharedRuntimeRequestObject) (api.GetSharedRuntimeResponseObject, error) {
	_, proj, err := callerAndProject(ctx)
	if err != nil {
		return nil, err
	}
	r, err := h.Svc.Get(ctx, proj, req.SharedRuntimeID)
	if err != nil {
		return nil, err
	}
	return api.GetSharedRuntime200JSONResponse{Body: apiRuntime(r)}, nil
}

// ListSharedRuntimeWorkers implements GET .../workers (a runtime has at most 64 workers;
// the page holds them after the cursor).
func (h *Handlers) ListSharedRuntimeWorkers(ctx context.Context, req api.ListSharedRuntimeWorkersRequestObject) (api.ListSharedRuntimeWorkersResponseObject, error) {
	_, proj, err := callerAndProject(ctx)
	if err != nil {
		return nil, err
	}
	sort := "shared_runtime_workers.id:" + req.SharedRuntimeID.String()
	after, size, err := h.page(req.Params.Cursor, req.Params.PageSize, sort)
	if err != nil {
		return nil, err
	}
	r, err := h.Svc.Get(ctx, proj, req.SharedRuntimeID)
	if err != nil {
		return nil, err
	}
	out := api.SharedRuntimeWorkerListResponse{Items: []api.SharedRuntimeWorker{}, Pagination: api.Pagination{PageSize: size}}
	var last uuid.UUID
	more := false
	for _, w := range r.Workers {
		if w.ID.String() <= after.String() && after != uuid.Nil {
			continue
		}
		if len(out.Items) == size {
			more = true
			break
		}
		out.Items = append(out.Items, apiWorker(w))
		last = w.ID
	}
	if out.Pagination.NextCursor, err = h.next(more, sort, last); err != nil {
		return nil, err
	}
	return api.ListSharedRuntimeWorkers200JSONResponse{Body: out}, nil
}

// ListSharedRuntimeAttachments implements GET .../attachments.
func (h *Handlers) ListSharedRuntimeAttachments(ctx context.Context, req api.ListSharedRuntimeAttachmentsRequestObject) (api.ListSharedRuntimeAttachmentsResponseObject, error) {
	_, proj, err := callerAndProject(ctx)
	if err != nil {
		return nil, err
	}
	sort := "shared_runtime_attachments.id:" + req.SharedRuntimeID.String() + ":" + proj.ID.String()
	after, size, err := h.page(req.Params.Cursor, req.Params.PageSize, sort)
	if err != nil {
		return nil, err
	}
	items, more, err := h.Svc.ListAttachments(ctx, proj, req.SharedRuntimeID, after, size)
	if err != nil {
		return nil, err
	}
	out := api.SharedRuntimeAttachmentListResponse{Items: make([]api.SharedRuntimeAttachment, 0, len(items)), Pagination: api.Pagination{PageSize: size}}
	for _, a := range items {
		out.Items = append(out.Items, apiAttachment(a))
	}
	if len(items) > 0 {
		if out.Pagination.NextCursor, err = h.next(more, sort, items[len(items)-1].ID); err != nil {
			return nil, err
		}
	}
	return api.ListSharedRuntimeAttachments200JSONResponse{Body: out}, nil
}

// CreateSharedRuntimeAttachment implements POST .../attachments.
func (h *Handlers) CreateSharedRuntimeAttachment(ctx context.Context, req api.CreateSharedRuntimeAttachmentRequestObject) (api.CreateSharedRuntimeAttachmentResponseObject, error) {
	p, proj, err := callerAndProject(ctx)
	if err != nil {
		return nil, err
	}
	a, err := h.Svc.Attach(ctx, proj, p.UserID, req.SharedRuntimeID)
	if err != nil {
		return nil, err
	}
	return api.CreateSharedRuntimeAttachment201JSONResponse{Body: apiAttachment(a)}, nil
}

// DeleteSharedRuntimeAttachment implements DELETE .../attachments/{attachment_id}.
func (h *Handlers) DeleteSharedRuntimeAttachment(ctx context.Context, req api.DeleteSharedRuntimeAttachmentRequestObject) (api.DeleteSharedRuntimeAttachmentResponseObject, error) {
	_, proj, err := callerAndProject(ctx)
	if err != nil {
		return nil, err
	}
	if err := h.Svc.Detach(ctx, proj, req.SharedRuntimeID, req.AttachmentID); err != nil {
		return nil, err
	}
	return api.DeleteSharedRuntimeAttachment204Response{}, nil
}

// ListSharedRuntimeWorkerOperations implements GET .../workers/{worker_id}/operations.
func (h *Handlers) ListSharedRuntimeWorkerOperations(ctx context.Context, req api.ListSharedRuntimeWorkerOperationsRequestObject) (api.ListSharedRuntimeWorkerOperationsResponseObject, error) {
	_, proj, err := callerAndProject(ctx)
	if err != nil {
		return nil, err
	}
	sort := "shared_runtime_worker_operations.id:" + req.WorkerID.String()
	after, size, err := h.page(req.Params.Cursor, req.Params.PageSize, sort)
	if err != nil {
		return nil, err
	}
	items, more, err := h.Svc.ListOperations(ctx, proj, req.SharedRuntimeID, req.WorkerID, after, false, size)
	if err != nil {
		return nil, err
	}
	out := api.SharedRuntimeWorkerOperationListResponse{Items: make([]api.SharedRuntimeWorkerOperation, 0, len(items)), Pagination: api.Pagination{PageSize: size}}
	for _, o := range items {
		out.Items = append(out.Items, apiWorkerOp(o))
	}
	if len(items) > 0 {
		if out.Pagination.NextCursor, err = h.next(more, sort, items[len(items)-1].ID); err != nil {
			return nil, err
		}
	}
	return api.ListSharedRuntimeWorkerOperations200JSONResponse{Body: out}, nil
}

// CreateSharedRuntimeWorkerOperation implements POST .../workers/{worker_id}/operations.
func (h *Handlers) CreateSharedRuntimeWorkerOperation(ctx context.Context, req api.CreateSharedRuntimeWorkerOperationRequestObject) (api.CreateSharedRuntimeWorkerOperationResponseObject, error) {
	p, proj, err := callerAndProject(ctx)
	if err != nil {
		return nil, err
	}
	if req.Body == nil {
		return nil, apierr.Validation("body", "a body is required")
	}
	o, err := h.Svc.CreateWorkerOperation(ctx, proj, p.UserID, req.SharedRuntimeID, req.WorkerID, string(req.Body.Kind))
	if err != nil {
		return nil, err
	}
	return api.CreateSharedRuntimeWorkerOperation202JSONResponse{Body: apiWorkerOp(o)}, nil
}

// GetSharedRuntimeWorkerOperation implements GET .../operations/{operation_id}.
func (h *Handlers) GetSharedRuntimeWorkerOperation(ctx context.Context, req api.GetSharedRuntimeWorkerOperationRequestObject) (api.GetSharedRuntimeWorkerOperationResponseObject, error) {
	_, proj, err := callerAndProject(ctx)
	if err != nil {
		return nil, err
	}
	o, err := h.Svc.WorkerOperation(ctx, proj, req.SharedRuntimeID, req.WorkerID, req.OperationID)
	if err != nil {
		return nil, err
	}
	return api.GetSharedRuntimeWorkerOperation200JSONResponse{Body: apiWorkerOp(o)}, nil
}

// ListSharedRuntimeRepairOperations implements GET .../repair-operations.
func (h *Handlers) ListSharedRuntimeRepairOperations(ctx context.Context, req api.ListSharedRuntimeRepairOperationsRequestObject) (api.ListSharedRuntimeRepairOperationsResponseObject, error) {
	_, proj, err := callerAndProject(ctx)
	if err != nil {
		return nil, err
	}
	sort := "shared_runtime_repair_operations.id:" + req.SharedRuntimeID.String()
	after, size, err := h.page(req.Params.Cursor, req.Params.PageSize, sort)
	if err != nil {
		return nil, err
	}
	items, more, err := h.Svc.ListOperations(ctx, proj, req.SharedRuntimeID, uuid.Nil, after, true, size)
	if err != nil {
		return nil, err
	}
	out := api.SharedRuntimeRepairOperationListResponse{Items: make([]api.SharedRuntimeRepairOperation, 0, len(items)), Pagination: api.Pagination{PageSize: size}}
	for _, o := range items {
		out.Items = append(out.Items, apiRepair(o))
	}
	if len(items) > 0 {
		if out.Pagination.NextCursor, err = h.next(more, sort, items[len(items)-1].ID); err != nil {
			return nil, err
		}
	}
	return api.ListSharedRuntimeRepairOperations200JSONResponse{Body: out}, nil
}

// CreateSharedRuntimeRepairOperation implements POST .../repair-operations.
func (h *Handlers) CreateSharedRuntimeRepairOperation(ctx context.Context, req api.CreateSharedRuntimeRepairOperationRequestObject) (api.CreateSharedRuntimeRepairOperationResponseObject, error) {
	p, proj, err := callerAndProject(ctx)
	if err != nil {
		return nil, err
	}
	if req.Body == nil {
		return nil, apierr.Validation("body", "a body is required")
	}
	o, err := h.Svc.CreateRepairOperation(ctx, proj, p.UserID, req.SharedRuntimeID, string(req.Body.Kind))
	if err != nil {
		return nil, err
	}
	return api.CreateSharedRuntimeRepairOperation202JSONResponse{Body: apiRepair(o)}, nil
}

// GetSharedRuntimeRepairOperation implements GET .../repair-operations/{repair_operation_id}.
func (h *Handlers) GetSharedRuntimeRepairOperation(ctx context.Context, req api.GetSharedRuntimeRepairOperationRequestObject) (api.GetSharedRuntimeRepairOperationResponseObject, error) {
	_, proj, err := callerAndProject(ctx)
	if err != nil {
		return nil, err
	}
	o, err := h.Svc.RepairOperation(ctx, proj, req.SharedRuntimeID, req.RepairOperationID)
	if err != nil {
		return nil, err
	}
	return api.GetSharedRuntimeRepairOperation200JSONResponse{Body: apiRepair(o)}, nil
}
