package devenv

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/auth"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// The seeded accounts.
const (
	AdminUsername   = "admin"
	DemoUsername    = "demo"
	DemoTenantName  = "Demo"
	DemoTenantSlug  = "demo"
	demoDisplayName = "Demo User"
)

// seedLockID serializes concurrent seeds of one database ("gantry.dev.seed").
const seedLockID int64 = 0x6761_6e74_7279_0d01

// SeedInput is what Seed needs; Clock and IDs default to the real ones.
type SeedInput struct {
	AdminPassword string
	DemoPassword  string
	// DemoClientSecret, when set, seeds the demo service account with a credential of
	// that secret (seed_machine.go).
	DemoClientSecret string
	Clock            clock.Clock
	IDs              ids.Source
}

// Seeded identifies the seeded rows.
type Seeded struct {
	AdminID      uuid.UUID
	TenantID     uuid.UUID
	DemoUserID   uuid.UUID
	DepartmentID uuid.UUID
	ProjectID    uuid.UUID
	// DemoClientID is the demo service account's client id ("" when not seeded).
	DemoClientID string
	// Changes lists what this call created, repaired or reset; empty when everything
	// was already in place.
	Changes []string
}

// Seed makes sure the platform admin, the demo tenant (with its default department and
// project) and the demo user exist, in one transaction. It is idempotent: rows that
// exist are kept (same ids); only passwords that no longer verify against the given
// ones are reset, and a demo user who lost its tenant-admin role or ownership of the
// default project gets it back.
func Seed(ctx context.Context, pool *pgxpool.Pool, in SeedInput) (Seeded, error) {
	if in.Clock == nil {
		in.Clock = clock.Real{}
	}
	if in.IDs == nil {
		in.IDs = ids.V7{}
	}
	for _, pw := range []string{in.AdminPassword, in.DemoPassword} {
		if err := auth.ValidatePassword(pw); err != nil {
			return Seeded{}, fmt.Errorf("seed: %w", err)
		}
	}
	s := &seeder{in: in, audit: &audit.Log{Clock: in.Clock, IDs: in.IDs}, tenancy: tenancy.New(pool, in.Clock, in.IDs, auth.HashPassword)}
	err := db.InTx(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, seedLockID); err != nil {
			return fmt.Errorf("seed lock: %w", err)
		}
		if err := s.admin(ctx, tx); err != nil {
			return err
		}
		if err := s.demo(ctx, tx); err != nil {
			return err
		}
		if in.DemoClientSecret == "" {
			return nil
		}
		return s.demoServiceAccount(ctx, tx)
	})
	if err != nil {
		return Seeded{}, fmt.Errorf("seed: %w", err)
	}
	if err := seedBilling(ctx, pool, in, &s.out); err != nil {
		return Seeded{}, fmt.Errorf("seed: %w", err)
	}
	if err := seedCatalog(ctx, pool, in, &s.out); err != nil {
		return Seeded{}, fmt.Errorf("seed: %w", err)
	}
	if err := seedApps(ctx, pool, in, &s.out); err != nil {
		return Seeded{}, fmt.Errorf("seed: %w", err)
	}
	return s.out, nil
}

type seeder struct {
	in      SeedInput
	audit   *audit.Log
	tenancy *tenancy.Service
	out     Seeded
}

type userRow struct {
	id         uuid.UUID
	role       string
	status     string
	tenantID   uuid.NullUUID
	tenantRole *string
	hash       *string
}

func getUser(ctx context.Context, tx pgx.Tx, username string) (userRow, bool, error) {
	var u userRow
	err := tx.QueryRow(ctx, `SELECT id, role, status, tenant_id, tenant_role, password_hash FROM users WHERE username = $1`, username).
		Scan(&u.id, &u.role, &u.status, &u.tenantID, &u.tenantRole, &u.hash)
	if errors.Is(err, pgx.ErrNoRows) {
		return userRow{}, false, nil
	}
	if err != nil {
		return userRow{}, false, fmt.Errorf("look up user %s: %w", username, err)
	}
	return u, true, nil
}

// admin seeds the platform admin: users.role = 'admin', outside any tenant; the
// users.role trigger of migration 00550 binds it to platform_superadmin (docs/api.md
// "Platform roles"), idempotently on every re-seed.
func (s *seeder) admin(ctx context.Context, tx pgx.Tx) error {
	now := s.in.Clock.Now()
	u, found, err := getUser(ctx, tx, AdminUsername)
	if err != nil {
		return err
	}
	if !found {
		hash, err := auth.HashPassword(s.in.AdminPassword)
		if err != nil {
			return err
		}
		id := s.in.IDs.New()
		if _, err := tx.Exec(ctx, `
			INSERT INTO users (id, username, display_name, password_hash, role, status, created_at, updated_at)
			VALUES ($1, $2, $3, $4, 'admin', 'active', $5, $5)`,
			id, AdminUsername, "Platform Admin", hash, now); err != nil {
			return fmt.Errorf("insert platform admin: %w", err)
		}
		if err := s.record(ctx, tx, "user.create", id, uuid.Nil, map[string]any{"username": AdminUsername, "role": "admin"}); err != nil {
			return err
		}
		s.out.AdminID = id
		s.out.Changes = append(s.out.Changes, "created platform admin "+AdminUsername)
		return nil
	}
	if u.tenantID.Valid {
		return fmt.Errorf("user %q belongs to a tenant, so it cannot be the platform admin; use a fresh database (unset DATABASE_URL or drop %s)", AdminUsername, DevDatabase)
	}
	s.out.AdminID = u.id
	if u.role != "admin" || u.status != "active" {
		if _, err := tx.Exec(ctx, `UPDATE users SET role = 'admin', status = 'active', updated_at = $2 WHERE id = $1`, u.id, now); err != nil {
			return fmt.Errorf("restore platform admin: %w", err)
		}
		if err := s.record(ctx, tx, "user.update", u.id, uuid.Nil, map[string]any{"role": "admin", "status": "active"}); err != nil {
			return err
		}
		s.out.Changes = append(s.out.Changes, "restored role admin / status active of "+AdminUsername)
	}
	return s.syncPassword(ctx, tx, u, AdminUsername, s.in.AdminPassword, uuid.Nil)
}

// demo seeds the demo tenant through tenancy.Provision, or checks the one that exists.
func (s *seeder) demo(ctx context.Context, tx pgx.Tx) error {
	var tenantID uuid.UUID
	err := tx.QueryRow(ctx, `SELECT id FROM tenants WHERE slug = $1`, DemoTenantSlug).Scan(&tenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		p, err := s.tenancy.Provision(ctx, tx, tenancy.ProvisionInput{
			Kind: tenancy.KindOrganization, Name: DemoTenantName, Slug: DemoTenantSlug,
			Admin: tenancy.NewUser{Username: DemoUsername, Password: s.in.DemoPassword, DisplayName: demoDisplayName},
		})
		if err != nil {
			var ae *apierr.Error
			if errors.As(err, &ae) && ae.Code == apierr.UserAlreadyExists {
				return fmt.Errorf("provision demo tenant: the username %q is taken by a user of another tenant; use a fresh database", DemoUsername)
			}
			return fmt.Errorf("provision demo tenant: %w", err)
		}
		s.out.TenantID, s.out.DemoUserID, s.out.DepartmentID, s.out.ProjectID = p.Tenant.ID, p.Admin.ID, p.Department.ID, p.Project.ID
		s.out.Changes = append(s.out.Changes, fmt.Sprintf("provisioned tenant %q with user %s", DemoTenantName, DemoUsername))
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up demo tenant: %w", err)
	}
	s.out.TenantID = tenantID

	if err := tx.QueryRow(ctx, `SELECT id FROM departments WHERE tenant_id = $1 AND is_default`, tenantID).Scan(&s.out.DepartmentID); err != nil {
		return fmt.Errorf("demo tenant has no default department (%w); use a fresh database", err)
	}
	if err := tx.QueryRow(ctx, `SELECT id FROM projects WHERE tenant_id = $1 AND is_default`, tenantID).Scan(&s.out.ProjectID); err != nil {
		return fmt.Errorf("demo tenant has no default project (%w); use a fresh database", err)
	}
	u, found, err := getUser(ctx, tx, DemoUsername)
	if err != nil {
		return err
	}
	if !found || u.tenantID.UUID != tenantID {
		return fmt.Errorf("the demo tenant exists but user %q is not one of its users; use a fresh database", DemoUsername)
	}
	s.out.DemoUserID = u.id
	now := s.in.Clock.Now()
	if u.tenantRole == nil || *u.tenantRole != principal.TenantRoleAdmin || u.status != "active" {
		if _, err := tx.Exec(ctx, `UPDATE users SET tenant_role = $2, status = 'active', updated_at = $3 WHERE id = $1`, u.id, principal.TenantRoleAdmin, now); err != nil {
			return fmt.Errorf("restore demo user: %w", err)
		}
		if err := s.record(ctx, tx, "user.update", u.id, tenantID, map[string]any{"tenant_role": principal.TenantRoleAdmin, "status": "active"}); err != nil {
			return err
		}
		s.out.Changes = append(s.out.Changes, "restored tenant admin role of "+DemoUsername)
	}
	var role string
	err = tx.QueryRow(ctx, `SELECT role FROM project_members WHERE project_id = $1 AND user_id = $2`, s.out.ProjectID, u.id).Scan(&role)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("look up demo membership: %w", err)
	}
	if role != projectctx.RoleOwner {
		if _, err := tx.Exec(ctx, `
			INSERT INTO project_members (project_id, user_id, role, created_at, updated_at) VALUES ($1, $2, $3, $4, $4)
			ON CONFLICT (project_id, user_id) DO UPDATE SET role = EXCLUDED.role, updated_at = EXCLUDED.updated_at`,
			s.out.ProjectID, u.id, projectctx.RoleOwner, now); err != nil {
			return fmt.Errorf("restore demo ownership: %w", err)
		}
		if err := s.record(ctx, tx, "project.member.update", u.id, tenantID, map[string]any{"project_id": s.out.ProjectID.String(), "role": projectctx.RoleOwner}); err != nil {
			return err
		}
		s.out.Changes = append(s.out.Changes, "restored ownership of the default project to "+DemoUsername)
	}
	return s.syncPassword(ctx, tx, u, DemoUsername, s.in.DemoPassword, tenantID)
}

// syncPassword resets u's password hash when password does not verify against it.
func (s *seeder) syncPassword(ctx context.Context, tx pgx.Tx, u userRow, username, password string, tenantID uuid.UUID) error {
	if auth.CheckPassword(password, u.hash) {
		return nil
	}
	hash, err := auth.HashPassword(password)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE users SET password_hash = $2, updated_at = $3 WHERE id = $1`, u.id, hash, s.in.Clock.Now()); err != nil {
		return fmt.Errorf("reset password of %s: %w", username, err)
	}
	if err := s.record(ctx, tx, "user.password_reset", u.id, tenantID, nil); err != nil {
		return err
	}
	s.out.Changes = append(s.out.Changes, "reset the password of "+username+" to the one in "+SecretsFile)
	return nil
}

func (s *seeder) record(ctx context.Context, tx pgx.Tx, action string, userID, tenantID uuid.UUID, meta map[string]any) error {
	if meta == nil {
		meta = map[string]any{}
	}
	meta["source"] = "make dev"
	return s.audit.Record(ctx, tx, audit.Entry{
		Action: action, TargetType: "user", TargetID: userID.String(), TenantID: tenantID,
		ActorType: audit.ActorSystem, Metadata: meta,
	})
}
