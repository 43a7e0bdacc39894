package tenancy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy/tenancydb"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Project is a project as a caller sees it: Role is the caller's effective role.
type Project struct {
	ID             uuid.UUID
	TenantID       uuid.UUID
	TenantName     string
	DepartmentID   uuid.UUID
	DepartmentName string
	DepartmentSlug string
	Name           string
	Slug           string
	IsDefault      bool
	CreatedAt      time.Time
	UpdatedAt      time.Time
	Role           string
}

func projectFrom(r tenancydb.GetProjectViewRow, role string) Project {
	return Project{
		ID: r.ID, TenantID: r.TenantID, TenantName: r.TenantName, DepartmentID: r.DepartmentID,
		DepartmentName: r.DepartmentName, DepartmentSlug: r.DepartmentSlug, Name: r.Name, Slug: r.Slug,
		IsDefault: r.IsDefault, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, Role: role,
	}
}

// maxListedProjects bounds ListProjects (ProjectListResponse holds at most 1000 items).
const maxListedProjects = 1000

// projectView loads project id as userID sees it; role "" takes the membership role.
func (s *Service) projectView(ctx context.Context, q *tenancydb.Queries, id, userID uuid.UUID, role string) (Project, error) {
	row, err := q.GetProjectView(ctx, tenancydb.GetProjectViewParams{ProjectID: id, UserID: userID})
	if err != nil {
		return Project{}, fmt.Errorf("load project: %w", err)
	}
	if role == "" {
		role = row.MemberRole
	}
	return projectFrom(row, role), nil
}

// ListProjects is every project of the caller's tenant the caller has a role in, with
// that role. Tenant admins see every project of the tenant, as at least admin.
func (s *Service) ListProjects(ctx context.Context, p *principal.Principal) ([]Project, error) {
	out := []Project{}
	if p == nil || p.TenantID == uuid.Nil {
		return out, nil
	}
	q := s.read(ctx)
	if p.IsTenantAdmin(p.TenantID) {
		rows, err := q.ListTenantProjects(ctx, tenancydb.ListTenantProjectsParams{UserID: p.UserID, TenantID: p.TenantID, MaxRows: maxListedProjects})
		if err != nil {
			return nil, fmt.Errorf("list projects: %w", err)
		}
		for _, r := range rows {
			out = append(out, projectFrom(tenancydb.GetProjectViewRow(r), projectctx.Stronger(r.MemberRole, projectctx.RoleAdmin)))
		}
		return out, nil
	}
	rows, err := q.ListMemberProjects(ctx, tenancydb.ListMemberProjectsParams{UserID: p.UserID, TenantID: p.TenantID, MaxRows: maxListedProjects})
	if err != nil {
		return nil, fmt.Errorf("list projects: %w", err)
	}
	for _, r := range rows {
		out = append(out, projectFrom(tenancydb.GetProjectViewRow(r), r.MemberRole))
	}
	return out, nil
}

// NewProject is a project to create.
type NewProject struct {
	Name         string
	Slug         string    // derived from Name (and made unique) when empty
	DepartmentID uuid.UUID // the tenant's default department when uuid.Nil
}

// CreateProject creates a project in the caller's tenant; any tenant member may, and
// becomes its owner.
func (s *Service) CreateProject(ctx context.Context, p *principal.Principal, in NewProject) (Project, error) {
	tenant, err := tenantOf(p)
	if err != nil {
		return Project{}, err
	}
	var out Project
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := tenancydb.New(tx)
		dept, err := s.departmentForProject(ctx, q, tenant, in.DepartmentID)
		if err != nil {
			return err
		}
		now := s.Clock.Now()
		var id uuid.UUID
		for attempt := 0; ; attempt++ {
			slug, explicit := in.Slug, in.Slug != ""
			if !explicit {
				slug = s.slugCandidate(Slugify(in.Name, "project"), attempt)
			}
			id, err = q.InsertProject(ctx, tenancydb.InsertProjectParams{
				ID: s.IDs.New(), TenantID: tenant, DepartmentID: dept.ID, Name: in.Name, Slug: slug, CreatedAt: now,
			})
			if err == nil {
				break
			}
			if !isNoRows(err) {
				return fmt.Errorf("insert project: %w", err)
			}
			if explicit {
				return slugTaken("project")
			}
			if attempt+1 >= slugAttempts {
				return fmt.Errorf("insert project: no free slug for %q", in.Name)
			}
		}
		if _, err := q.InsertMember(ctx, tenancydb.InsertMemberParams{ProjectID: id, UserID: p.UserID, Role: projectctx.RoleOwner, CreatedAt: now}); err != nil {
			return fmt.Errorf("insert project owner: %w", err)
		}
		role := projectctx.RoleOwner
		out, err = s.projectView(ctx, q, id, p.UserID, role)
		if err != nil {
			return err
		}
		if err := s.Audit.Record(ctx, tx, audit.Entry{
			Action: "project.create", TargetType: "project", TargetID: id.String(), TenantID: tenant, ProjectID: id,
			Metadata: map[string]any{"slug": out.Slug, "department_id": dept.ID.String()},
		}); err != nil {
			return err
		}
		return s.enqueue(ctx, tx, EventProjectCreated, map[string]any{
			"project_id": id.String(), "tenant_id": tenant.String(), "department_id": dept.ID.String(), "is_default": false,
		})
	})
	return out, err
}

// departmentForProject is the department a new project goes to: the named one, which
// must be an active department of the tenant, or the tenant's default.
func (s *Service) departmentForProject(ctx context.Context, q *tenancydb.Queries, tenant, id uuid.UUID) (tenancydb.Department, error) {
	if id == uuid.Nil {
		d, err := q.GetDefaultDepartment(ctx, tenant)
		if err != nil {
			return d, fmt.Errorf("default department: %w", err)
		}
		return d, nil
	}
	d, err := q.GetDepartment(ctx, tenancydb.GetDepartmentParams{ID: id, TenantID: tenant})
	if isNoRows(err) {
		return d, notFound("department").With("field", "department_id")
	}
	if err != nil {
		return d, fmt.Errorf("get department: %w", err)
	}
	if d.LifecycleState != DepartmentActive {
		return d, apierr.Validation("department_id", "the department is disabled").With("reason", "department_disabled")
	}
	return d, nil
}

// GetProject is the project of the request's context, with the caller's role there.
func (s *Service) GetProject(ctx context.Context, pc projectctx.Project, userID uuid.UUID) (Project, error) {
	if err := Require(pc, ActRead); err != nil {
		return Project{}, err
	}
	if pc.Name != "" {
		// The project-context middleware already loaded the row for this request.
		return Project{
			ID: pc.ID, TenantID: pc.TenantID, TenantName: pc.TenantName, DepartmentID: pc.Department,
			DepartmentName: pc.DepartmentName, DepartmentSlug: pc.DepartmentSlug, Name: pc.Name, Slug: pc.Slug,
			IsDefault: pc.IsDefault, CreatedAt: pc.CreatedAt, UpdatedAt: pc.UpdatedAt, Role: pc.Role,
		}, nil
	}
	return s.projectView(ctx, s.read(ctx), pc.ID, userID, pc.Role)
}

// ProjectPatch is a partial project update; nil fields stay.
type ProjectPatch struct {
	Name *string
	Slug *string
}

// UpdateProject applies patch (admins and owners). A patch that changes nothing writes
// nothing and audits nothing.
func (s *Service) UpdateProject(ctx context.Context, pc projectctx.Project, userID uuid.UUID, patch ProjectPatch) (Project, error) {
	if err := Require(pc, ActUpdateProject); err != nil {
		return Project{}, err
	}
	var out Project
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := tenancydb.New(tx)
		if err := lockProject(ctx, q, pc.ID); err != nil {
			return err
		}
		cur, err := s.projectView(ctx, q, pc.ID, userID, pc.Role)
		if err != nil {
			return err
		}
		name, slug, changed := cur.Name, cur.Slug, map[string]any{}
		if patch.Name != nil && *patch.Name != cur.Name {
			name, changed["name"] = *patch.Name, *patch.Name
		}
		if patch.Slug != nil && *patch.Slug != cur.Slug {
			taken, err := q.ProjectSlugTaken(ctx, tenancydb.ProjectSlugTakenParams{TenantID: pc.TenantID, Slug: *patch.Slug, ID: pc.ID})
			if err != nil {
				return fmt.Errorf("check slug: %w", err)
			}
			if taken {
				return slugTaken("project")
			}
			slug, changed["slug"] = *patch.Slug, *patch.Slug
		}
		if len(changed) == 0 {
			out = cur
			return nil
		}
		err = q.UpdateProject(ctx, tenancydb.UpdateProjectParams{ID: pc.ID, Name: name, Slug: slug, UpdatedAt: s.Clock.Now()})
		if db.IsUniqueViolation(err, "") {
			return slugTaken("project")
		}
		if err != nil {
			return fmt.Errorf("update project: %w", err)
		}
		if out, err = s.projectView(ctx, q, pc.ID, userID, pc.Role); err != nil {
			return err
		}
		return s.Audit.Record(ctx, tx, audit.Entry{
			Action: "project.update", TargetType: "project", TargetID: pc.ID.String(), TenantID: pc.TenantID, ProjectID: pc.ID, Metadata: changed,
		})
	})
	return out, err
}

// DeleteProject deletes the project of the request's context (owners): a soft delete.
// The row stays with deleted_at set, so the billing usage records that refer to it, and
// the audit rows and ledger entries that name it, keep their meaning; from then on the
// project is listed nowhere, every access to it is refused as for a project that does
// not exist, and its slug is free. The default project stays, and so does a project with
// live workloads (409 invalid_request, details.reason project_in_use): they would run on,
// and be billed, in a project nobody can reach.
//
// The project row is locked FOR UPDATE first: that waits for any allocation insert of
// the project in flight (it holds the row FOR KEY SHARE, migration 00530), so the count
// of live workloads that follows sees it, and an insert that comes later waits for this
// transaction and then finds the project deleted.
func (s *Service) DeleteProject(ctx context.Context, pc projectctx.Project) error {
	if err := Require(pc, ActDeleteProject); err != nil {
		return err
	}
	if pc.IsDefault {
		return conflict("default_project", "the default project cannot be deleted")
	}
	return db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := tenancydb.New(tx)
		if err := lockProject(ctx, q, pc.ID); err != nil {
			return err
		}
		if s.ProjectInUse == nil {
			// A deletion that cannot tell whether workloads run would strand them.
			return errors.New("delete project: no ProjectInUse check is wired")
		}
		inUse, err := s.ProjectInUse(ctx, tx, pc.ID)
		if err != nil {
			return err
		}
		if inUse {
			return conflict("project_in_use", "the project still has live workloads: release them first")
		}
		n, err := q.SoftDeleteProject(ctx, tenancydb.SoftDeleteProjectParams{ID: pc.ID, DeletedAt: ptrTime(s.Clock.Now())})
		if err != nil {
			return fmt.Errorf("delete project: %w", err)
		}
		if n == 0 {
			return conflict("default_project", "the default project cannot be deleted")
		}
		if err := s.Audit.Record(ctx, tx, audit.Entry{
			Action: "project.delete", TargetType: "project", TargetID: pc.ID.String(), TenantID: pc.TenantID, ProjectID: pc.ID,
			Metadata: map[string]any{"slug": pc.Slug, "name": pc.Name},
		}); err != nil {
			return err
		}
		return s.enqueue(ctx, tx, EventProjectDeleted, map[string]any{"project_id": pc.ID.String(), "tenant_id": pc.TenantID.String()})
	})
}

// lockProject locks the live project row id for the rest of the transaction. A project
// deleted since the request's project check is refused as Access refuses one that does
// not exist.
func lockProject(ctx context.Context, q *tenancydb.Queries, id uuid.UUID) error {
	_, err := q.LockProject(ctx, id)
	if isNoRows(err) {
		return noProjectAccess()
	}
	if err != nil {
		return fmt.Errorf("lock project: %w", err)
	}
	return nil
}

func ptrTime(t time.Time) *time.Time { return &t }
