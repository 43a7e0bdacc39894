package attach

import (
	"context"
	"path"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/alloctask"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers is the storage attachments' slice of api.StrictServerInterface. The
// project-context middleware has checked the caller's role in X-Project-ID; every
// operation acts only on allocations of that project.
type Handlers struct {
	Svc     *Service
	Cursors pagination.Codec
}

// NewHandlers returns the handlers over svc.
func NewHandlers(svc *Service, cursors pagination.Codec) *Handlers {
	return &Handlers{Svc: svc, Cursors: cursors}
}

const sortAttachments = "storage_attachments.id"

func (h *Handlers) context(ctx context.Context) (*principal.Principal, projectctx.Project, error) {
	p, ok := principal.From(ctx)
	if !ok {
		return nil, projectctx.Project{}, apierr.New(apierr.TokenMissing, "authentication required")
	}
	proj, ok := projectctx.From(ctx)
	if !ok {
		return nil, projectctx.Project{}, apierr.New(apierr.InvalidRequest, "project context required")
	}
	if h.Svc == nil {
		return nil, projectctx.Project{}, apierr.New(apierr.ServiceUnavailable, "storage attachments are not available")
	}
	return p, proj, nil
}

// apiAttachment is the contract's view of a row. mount_path is the absolute path the
// agent reported once it has; before that, the path under the runtime user's home.
func apiAttachment(a Attachment) api.StorageAttachment {
	out := api.StorageAttachment{
		AttachmentID: a.ID, AllocationID: a.AllocationID, BucketID: a.BucketID, ProjectID: a.BucketProject,
		Mode: api.StorageAttachmentMode(a.Mode), State: api.StorageAttachmentState(a.State), Error: a.Error,
		CreatedAt: a.CreatedAt, UpdatedAt: a.UpdatedAt,
		MountPath: path.Join("/home", alloctask.UserName(a.AllocationID.String()), a.MountPath),
	}
	if a.HostPath != nil && *a.HostPath != "" {
		out.MountPath = *a.HostPath
	}
	if a.Method != nil {
		m := api.StorageAttachmentMethod(*a.Method)
		out.Method = &m
	}
	return out
}

// ListStorageAttachments implements GET /api/v1/allocations/{allocation_id}/storage-attachments.
func (h *Handlers) ListStorageAttachments(ctx context.Context, req api.ListStorageAttachmentsRequestObject) (api.ListStorageAttachmentsResponseObject, error) {
	_, proj, err := h.context(ctx)
	if err != nil {
		return nil, err
	}
	var after uuid.UUID
	if err := h.Cursors.DecodeAfter(req.Params.Cursor, sortAttachments, &after); err != nil {
		return nil, err
	}
	size := pagination.Size(req.Params.PageSize)
	rows, more, err := h.Svc.List(ctx, proj.ID, req.AllocationID, after, size)
	if err != nil {
		return nil, err
	}
	out := api.StorageAttachmentListResponse{Items: make([]api.StorageAttachment, 0, len(rows)), Pagination: api.Pagination{PageSize: size}}
	for _, r := range rows {
		out.Items = append(out.Items, apiAttachment(r))
	}
	if more {
		if out.Pagination.NextCursor, err = h.Cursors.Next(true, sortAttachments, rows[len(rows)-1].ID); err != nil {
			return nil, err
		}
	}
	return api.ListStorageAttachments200JSONResponse{Body: out}, nil
}

// CreateStorageAttachment implements POST /api/v1/allocations/{allocation_id}/storage-attachments.
func (h *Handlers) CreateStorageAttachment(ctx context.Context, req api.CreateStorageAttachmentRequestObject) (api.CreateStorageAttachmentResponseObject, error) {
	p, proj, err := h.context(ctx)
	if err != nil {
		return nil, err
	}
	if req.Body == nil {
		return nil, apierr.New(apierr.ValidationError, "a request body is required")
	}
	ar := AttachRequest{BucketID: req.Body.BucketID, Mode: string(req.Body.Mode)}
	if req.Body.BucketProjectID != nil {
		ar.BucketProject = *req.Body.BucketProjectID
	}
	if req.Body.MountPath != nil {
		ar.MountPath = *req.Body.MountPath
		if ar.MountPath == "" {
			return nil, apierr.New(apierr.ValidationError, "mount_path must not be empty (leave it out for the default)").With("field", "mount_path")
		}
	}
	a, err := h.Svc.Attach(ctx, p, proj.ID, req.AllocationID, ar)
	if err != nil {
		return nil, err
	}
	return api.CreateStorageAttachment202JSONResponse{Body: apiAttachment(a)}, nil
}

// DeleteStorageAttachment implements DELETE .../storage-attachments/{attachment_id}.
func (h *Handlers) DeleteStorageAttachment(ctx context.Context, req api.DeleteStorageAttachmentRequestObject) (api.DeleteStorageAttachmentResponseObject, error) {
	_, proj, err := h.context(ctx)
	if err != nil {
		return nil, err
	}
	a, err := h.Svc.Detach(ctx, proj.ID, req.AllocationID, req.AttachmentID)
	if err != nil {
		return nil, err
	}
	return api.DeleteStorageAttachment202JSONResponse{Body: apiAttachment(a)}, nil
}
