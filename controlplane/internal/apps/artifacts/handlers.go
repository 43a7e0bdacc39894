package artifacts

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/objpath"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers is the AppArtifacts slice of the strict server. The chain has checked the
// caller's role in the project of X-Project-ID.
type Handlers struct {
	Svc     *Service
	Cursors pagination.Codec
}

// NewHandlers returns the handlers over svc.
func NewHandlers(svc *Service, cursors pagination.Codec) *Handlers {
	return &Handlers{Svc: svc, Cursors: cursors}
}

const sortArtifacts = "app_artifacts.name_version"

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

func apiFile(f File) api.AppArtifactFile {
	return api.AppArtifactFile{Path: f.Path, SizeBytes: f.SizeBytes, Digest: f.Digest(), CreatedAt: f.CreatedAt}
}

func (h *Handlers) apiArtifact(a Artifact) api.AppArtifact {
	out := api.AppArtifact{ID: a.ID, ProjectID: a.ProjectID, Name: a.Name, Version: a.Version, Kind: api.AppArtifactKind(a.Kind),
		Description: a.Description, SizeBytes: a.Size(), FileCount: len(a.Files), Files: make([]api.AppArtifactFile, 0, len(a.Files)),
		StorageLocation: h.Svc.StorageLocation(a), CreatedByUserID: a.CreatedBy, CreatedAt: a.CreatedAt, UpdatedAt: a.UpdatedAt}
	if d := a.ContentDigest(); d != "" {
		out.ContentDigest = &d
	}
	for _, f := range a.Files {
		out.Files = append(out.Files, apiFile(f))
	}
	return out
}

// cleanPath applies the object store's path rules to a file path.
func cleanPath(raw string) (string, error) {
	p, err := objpath.Clean(raw)
	switch {
	case err == nil:
		return p, nil
	case errors.Is(err, objpath.ErrTraversal):
		return "", apierr.New(apierr.StoragePathTraversal, "the path escapes the artifact").With("field", "path")
	case errors.Is(err, objpath.ErrTooLong):
		return "", apierr.Validation("path", "path is longer than %d bytes", objpath.MaxLen).With("reason", "too_long")
	default:
		return "", apierr.Validation("path", "path is empty").With("reason", "empty")
	}
}

// ListAppArtifacts implements GET /api/v1/app-artifacts.
func (h *Handlers) ListAppArtifacts(ctx context.Context, req api.ListAppArtifactsRequestObject) (api.ListAppArtifactsResponseObject, error) {
	_, proj, err := callerAndProject(ctx)
	if err != nil {
		return nil, err
	}
	sort := sortArtifacts + ":" + proj.ID.String()
	var pos *Position
	if req.Params.Cursor != nil {
		pos = &Position{}
		if err := h.Cursors.Decode(*req.Params.Cursor, sort, pos); err != nil {
			return nil, err
		}
	}
	size := pagination.Size(req.Params.PageSize)
	items, more, err := h.Svc.List(ctx, proj.ID, pos, size)
	if err != nil {
		return nil, err
	}
	out := api.AppArtifactListResponse{Items: make([]api.AppArtifact, 0, len(items)), Pagination: api.Pagination{PageSize: size}}
	for _, a := range items {
		out.Items = append(out.Items, h.apiArtifact(a))
	}
	if more {
		last := items[len(items)-1]
		if out.Pagination.NextCursor, err = h.Cursors.Next(true, sort, Position{Name: last.Name, Version: last.Version, ID: last.ID}); err != nil {
			return nil, err
		}
	}
	return api.ListAppArtifacts200JSONResponse{Body: out}, nil
}

// CreateAppArtifact implements POST /api/v1/app-artifacts.
func (h *Handlers) CreateAppArtifact(ctx context.Context, req api.CreateAppArtifactRequestObject) (api.CreateAppArtifactResponseObject, error) {
	p, proj, err := callerAndProject(ctx)
	if err != nil {
		return nil, err
	}
	if req.Body == nil {
		return nil, apierr.Validation("body", "a body is required")
	}
	in := NewArtifact{Name: req.Body.Name, Version: req.Body.Version, Kind: string(req.Body.Kind)}
	if req.Body.Description != nil {
		in.Description = *req.Body.Description
	}
	a, err := h.Svc.Create(ctx, proj, p.UserID, in)
	if err != nil {
		return nil, err
	}
	return api.CreateAppArtifact201JSONResponse{Body: h.apiArtifact(a)}, nil
}

// GetAppArtifact implements GET /api/v1/app-artifacts/{artifact_id}.
func (h *Handlers) GetAppArtifact(ctx context.Context, req api.GetAppArtifactRequestObject) (api.GetAppArtifactResponseObject, error) {
	_, proj, err := callerAndProject(ctx)
	if err != nil {
		return nil, err
	}
	a, err := h.Svc.Get(ctx, proj.ID, req.ArtifactID)
	if err != nil {
		return nil, err
	}
	return api.GetAppArtifact200JSONResponse{Body: h.apiArtifact(a)}, nil
}

// PutAppArtifactFile implements PUT /api/v1/app-artifacts/{artifact_id}/files.
func (h *Handlers) PutAppArtifactFile(ctx context.Context, req api.PutAppArtifactFileRequestObject) (api.PutAppArtifactFileResponseObject, error) {
	_, proj, err := callerAndProject(ctx)
	if err != nil {
		return nil, err
	}
	path, err := cleanPath(req.Params.Path)
	if err != nil {
		return nil, err
	}
	body := req.Body
	if body == nil {
		body = http.NoBody
	}
	f, err := h.Svc.PutFile(ctx, proj.ID, req.ArtifactID, path, body)
	if err != nil {
		return nil, err
	}
	return api.PutAppArtifactFile201JSONResponse{Body: apiFile(f)}, nil
}

// GetAppArtifactFile implements GET /api/v1/app-artifacts/{artifact_id}/files.
func (h *Handlers) GetAppArtifactFile(ctx context.Context, req api.GetAppArtifactFileRequestObject) (api.GetAppArtifactFileResponseObject, error) {
	_, proj, err := callerAndProject(ctx)
	if err != nil {
		return nil, err
	}
	path, err := cleanPath(req.Params.Path)
	if err != nil {
		return nil, err
	}
	f, rc, err := h.Svc.OpenFile(ctx, proj.ID, req.ArtifactID, path)
	if err != nil {
		return nil, err
	}
	return &fileResponse{file: f, body: rc}, nil
}

// fileResponse streams a file. Once the status is sent, an error (a digest mismatch
// among them) can no longer become an envelope: the connection is aborted instead, so
// the client sees a body shorter than its Content-Length, never different bytes.
type fileResponse struct {
	file File
	body io.ReadCloser
}

func (r *fileResponse) VisitGetAppArtifactFileResponse(w http.ResponseWriter) error {
	defer r.body.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(r.file.SizeBytes, 10))
	w.Header().Set("ETag", `"`+r.file.SHA256+`"`)
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, r.body); err != nil {
		panic(http.ErrAbortHandler)
	}
	return nil
}
