package tenancy

import (
	"context"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"

	"github.com/gantry-gpu/gantry/proto/api"
)

// ListProjects implements GET /api/v1/projects.
func (h *Handlers) ListProjects(ctx context.Context, _ api.ListProjectsRequestObject) (api.ListProjectsResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	projects, err := h.Svc.ListProjects(ctx, p)
	if err != nil {
		return nil, err
	}
	out := api.ProjectListResponse{Items: make([]api.Project, 0, len(projects))}
	for _, pr := range projects {
		out.Items = append(out.Items, apiProject(pr))
	}
	return api.ListProjects200JSONResponse{Body: out}, nil
}

// CreateProject implements POST /api/v1/projects.
func (h *Handlers) CreateProject(ctx context.Context, req api.CreateProjectRequestObject) (api.CreateProjectResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	in := NewProject{Name: req.Body.Name, Slug: deref(req.Body.Slug)}
	if req.Body.DepartmentID != nil {
		in.DepartmentID = *req.Body.DepartmentID
	}
	pr, err := h.Svc.CreateProject(ctx, p, in)
	if err != nil {
		return nil, err
	}
	return api.CreateProject201JSONResponse{Body: api.CreateProjectResponse{Project: apiProject(pr)}}, nil
}

// GetProject implements GET /api/v1/projects/{project_id}.
func (h *Handlers) GetProject(ctx context.Context, req api.GetProjectRequestObject) (api.GetProjectResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	pc, err := projectOf(ctx, req.ProjectID)
	if err != nil {
		return nil, err
	}
	pr, err := h.Svc.GetProject(ctx, pc, p.UserID)
	if err != nil {
		return nil, err
	}
	return api.GetProject200JSONResponse{Body: apiProject(pr)}, nil
}

// UpdateProject implements PATCH /api/v1/projects/{project_id}.
func (h *Handlers) UpdateProject(ctx context.Context, req api.UpdateProjectRequestObject) (api.UpdateProjectResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	pc, err := projectOf(ctx, req.ProjectID)
	if err != nil {
		return nil, err
	}
	pr, err := h.Svc.UpdateProject(ctx, pc, p.UserID, ProjectPatch{Name: req.Body.Name, Slug: req.Body.Slug})
	if err != nil {
		return nil, err
	}
	return api.UpdateProject200JSONResponse{Body: apiProject(pr)}, nil
}

// DeleteProject implements DELETE /api/v1/projects/{project_id}.
func (h *Handlers) DeleteProject(ctx context.Context, req api.DeleteProjectRequestObject) (api.DeleteProjectResponseObject, error) {
	pc, err := projectOf(ctx, req.ProjectID)
	if err != nil {
		return nil, err
	}
	if err := h.Svc.DeleteProject(ctx, pc); err != nil {
		return nil, err
	}
	return api.DeleteProject200JSONResponse{Body: api.DeleteProjectResponse{Ok: true, ProjectID: pc.ID}}, nil
}
