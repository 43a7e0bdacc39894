package tenancy

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy/tenancydb"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Tenant kinds.
const (
	KindOrganization = "organization"
	KindPersonal     = "personal"
)

// Defaults every tenant is provisioned with.
const (
	DefaultCurrency       = "USD"
	DefaultDepartmentName = "Default"
	DefaultProjectName    = "Default"
	DefaultSlug           = "default"
)

// NewUser is a user to create in a tenant.
type NewUser struct {
	Username    string
	Password    string
	DisplayName string // the username when empty
	TenantRole  string // principal.TenantRoleAdmin or principal.TenantRoleMember
}

// ProvisionInput describes a tenant to create.
type ProvisionInput struct {
	Kind            string
	Name            string
	Slug            string // derived from Name (and made unique) when empty; a taken explicit slug is refused
	DefaultCurrency string // DefaultCurrency when empty
	Admin           NewUser
	// AdminField names the request field of the admin's username in errors.
	AdminField string
}

// Provisioned is what Provision created.
type Provisioned struct {
	Tenant     tenancydb.Tenant
	Admin      tenancydb.User
	Department tenancydb.Department
	Project    Project
}

// Provision creates, with tx, a tenant, its default department and default project, and
// its first tenant admin, who owns the default project. It writes the tenant.create audit
// row and the tenant.created and project.created events with the same transaction.
func (s *Service) Provision(ctx context.Context, tx pgx.Tx, in ProvisionInput) (Provisioned, error) {
	q := tenancydb.New(tx)
	now := s.Clock.Now()
	if in.Kind != KindOrganization && in.Kind != KindPersonal {
		return Provisioned{}, fmt.Errorf("provision: unknown tenant kind %q", in.Kind)
	}
	currency := in.DefaultCurrency
	if currency == "" {
		currency = DefaultCurrency
	}

	var tenant tenancydb.Tenant
	var err error
	for attempt := 0; ; attempt++ {
		slug, explicit := in.Slug, in.Slug != ""
		if !explicit {
			slug = s.slugCandidate(Slugify(in.Name, "org"), attempt)
		}
		tenant, err = q.InsertTenant(ctx, tenancydb.InsertTenantParams{
			ID: s.IDs.New(), Name: in.Name, Slug: slug, Kind: in.Kind, DefaultCurrency: currency, CreatedAt: now,
		})
		if err == nil {
			break
		}
		if !isNoRows(err) {
			return Provisioned{}, fmt.Errorf("insert tenant: %w", err)
		}
		if explicit {
			return Provisioned{}, slugTaken("tenant")
		}
		if attempt+1 >= slugAttempts {
			return Provisioned{}, fmt.Errorf("insert tenant: no free slug for %q", in.Name)
		}
	}

	in.Admin.TenantRole = principal.TenantRoleAdmin
	field := in.AdminField
	if field == "" {
		field = "username"
	}
	admin, err := s.insertUser(ctx, q, tenant.ID, in.Admin, field)
	if err != nil {
		return Provisioned{}, err
	}

	dept, err := q.InsertDepartment(ctx, tenancydb.InsertDepartmentParams{
		ID: s.IDs.New(), TenantID: tenant.ID, DisplayName: DefaultDepartmentName, Slug: DefaultSlug, IsDefault: true, CreatedAt: now,
	})
	if err != nil {
		return Provisioned{}, fmt.Errorf("insert default department: %w", err)
	}
	projectID, err := q.InsertProject(ctx, tenancydb.InsertProjectParams{
		ID: s.IDs.New(), TenantID: tenant.ID, DepartmentID: dept.ID, Name: DefaultProjectName, Slug: DefaultSlug, IsDefault: true, CreatedAt: now,
	})
	if err != nil {
		return Provisioned{}, fmt.Errorf("insert default project: %w", err)
	}
	if _, err := q.InsertMember(ctx, tenancydb.InsertMemberParams{
		ProjectID: projectID, UserID: admin.ID, Role: projectctx.RoleOwner, CreatedAt: now,
	}); err != nil {
		return Provisioned{}, fmt.Errorf("insert default project owner: %w", err)
	}
	project, err := s.projectView(ctx, q, projectID, admin.ID, projectctx.RoleOwner)
	if err != nil {
		return Provisioned{}, err
	}

	if err := s.Audit.Record(ctx, tx, audit.Entry{
		Action: "tenant.create", TargetType: "tenant", TargetID: tenant.ID.String(), TenantID: tenant.ID,
		Metadata: map[string]any{
			"kind": tenant.Kind, "slug": tenant.Slug, "admin_user_id": admin.ID.String(),
			"default_department_id": dept.ID.String(), "default_project_id": projectID.String(),
		},
	}); err != nil {
		return Provisioned{}, err
	}
	if err := s.enqueue(ctx, tx, EventTenantCreated, map[string]any{
		"tenant_id": tenant.ID.String(), "kind": tenant.Kind, "admin_user_id": admin.ID.String(),
	}); err != nil {
		return Provisioned{}, err
	}
	if err := s.enqueue(ctx, tx, EventProjectCreated, map[string]any{
		"project_id": projectID.String(), "tenant_id": tenant.ID.String(), "department_id": dept.ID.String(), "is_default": true,
	}); err != nil {
		return Provisioned{}, err
	}
	return Provisioned{Tenant: tenant, Admin: admin, Department: dept, Project: project}, nil
}

// ProvisionPersonal creates a personal tenant named orgName for a sign-up, with username
// as its tenant admin, and returns the new user's id. A taken username is
// user_already_exists. Auth calls it with its own transaction.
func (s *Service) ProvisionPersonal(ctx context.Context, tx pgx.Tx, username, password, displayName, orgName string) (uuid.UUID, error) {
	out, err := s.Provision(ctx, tx, ProvisionInput{
		Kind: KindPersonal, Name: orgName,
		Admin: NewUser{Username: username, Password: password, DisplayName: displayName},
	})
	if err != nil {
		return uuid.Nil, err
	}
	return out.Admin.ID, nil
}

// insertUser hashes the password and inserts the user; a taken username is
// user_already_exists naming field.
func (s *Service) insertUser(ctx context.Context, q *tenancydb.Queries, tenantID uuid.UUID, u NewUser, field string) (tenancydb.User, error) {
	if s.HashPassword == nil {
		return tenancydb.User{}, fmt.Errorf("tenancy: no password hasher configured")
	}
	hash, err := s.HashPassword(u.Password)
	if err != nil {
		return tenancydb.User{}, fmt.Errorf("hash password: %w", err)
	}
	display := u.DisplayName
	if display == "" {
		display = u.Username
	}
	role := u.TenantRole
	user, err := q.InsertUser(ctx, tenancydb.InsertUserParams{
		ID: s.IDs.New(), Username: u.Username, DisplayName: display, PasswordHash: &hash,
		TenantID: uuid.NullUUID{UUID: tenantID, Valid: true}, TenantRole: &role, CreatedAt: s.Clock.Now(),
	})
	if isNoRows(err) {
		return tenancydb.User{}, apierr.New(apierr.UserAlreadyExists, "username is already taken").With("field", field)
	}
	if err != nil {
		return tenancydb.User{}, fmt.Errorf("insert user: %w", err)
	}
	return user, nil
}
