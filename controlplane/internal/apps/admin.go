package apps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// NewApp is an app as an admin creates it.
type NewApp struct {
	Slug, Name, Description, Kind string
	Versions                      []Version
}

// AppChange is a partial update; nil fields stay.
type AppChange struct {
	Name, Description, Kind *string
	Deprecated              *bool
}

// Entitlement lets one tenant (uuid.Nil: every tenant) launch an app.
type Entitlement struct {
	ID        uuid.UUID
	AppSlug   string
	TenantID  uuid.UUID
	CreatedBy uuid.UUID
	CreatedAt time.Time
}

// CheckVersion validates what the contract's schema cannot say and fills the defaults:
// env names unique, an http health check has a path and a tcp one none.
func CheckVersion(v *Version) error {
	seen := map[string]bool{}
	for _, e := range v.Env {
		if seen[e.Name] {
			return apierr.Validation("env", "environment variable %s is declared twice", e.Name).With("reason", "duplicate_env")
		}
		seen[e.Name] = true
	}
	if v.Env == nil {
		v.Env = []EnvVar{}
	}
	switch v.Health.Type {
	case "http":
		if v.Health.Path == "" {
			return apierr.Validation("health_check.path", "an http health check needs a path")
		}
	case "tcp":
		if v.Health.Path != "" {
			return apierr.Validation("health_check.path", "a tcp health check has no path")
		}
	default:
		return apierr.Validation("health_check.type", "health_check.type must be http or tcp")
	}
	if v.Health.IntervalSeconds == 0 {
		v.Health.IntervalSeconds = DefaultHealthInterval
	}
	if v.Health.TimeoutSeconds == 0 {
		v.Health.TimeoutSeconds = DefaultHealthTimeout
	}
	if v.Health.FailureThreshold == 0 {
		v.Health.FailureThreshold = DefaultHealthFailures
	}
	if v.Health.StartupTimeoutSeconds == 0 {
		v.Health.StartupTimeoutSeconds = DefaultStartupTimeoutSecond
	}
	if v.Placement == "" {
		v.Placement = PlacementInstance
	}
	if v.Placement != PlacementInstance && v.Placement != PlacementWholeAllocation {
		return apierr.Validation("placement", "placement must be instance or whole_allocation")
	}
	return nil
}

// CreateApp adds an app and its versions, audited app.create in the same transaction.
func (s *Service) CreateApp(ctx context.Context, actor uuid.UUID, in NewApp) (App, error) {
	seen := map[string]bool{}
	for i := range in.Versions {
		if seen[in.Versions[i].Version] {
			return App{}, apierr.Validation("versions", "version %s is declared twice", in.Versions[i].Version).With("reason", "duplicate_version")
		}
		seen[in.Versions[i].Version] = true
		if err := CheckVersion(&in.Versions[i]); err != nil {
			return App{}, err
		}
	}
	now := s.Clock.Now()
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO apps (slug, name, description, kind, created_by, created_at, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, $6)`, in.Slug, in.Name, in.Description, in.Kind, actor, now)
		if db.IsUniqueViolation(err, "apps_pkey") {
			return apierr.New(apierr.InvalidRequest, "an app with slug %s exists", in.Slug).With("reason", "app_exists").WithStatus(409)
		}
		if err != nil {
			return fmt.Errorf("insert app: %w", err)
		}
		for _, v := range in.Versions {
			if err := insertVersion(ctx, tx, in.Slug, v, actor, now); err != nil {
				return err
			}
		}
		return s.Audit.Record(ctx, tx, audit.Entry{Action: "app.create", TargetType: "app", TargetID: in.Slug,
			Metadata: map[string]any{"kind": in.Kind, "versions": len(in.Versions)}})
	})
	if err != nil {
		return App{}, err
	}
	return s.GetApp(ctx, uuid.Nil, in.Slug)
}

func insertVersion(ctx context.Context, tx pgx.Tx, slug string, v Version, actor uuid.UUID, now time.Time) error {
	env, err := json.Marshal(v.Env)
	if err != nil {
		return err
	}
	var path, model *string
	if v.Health.Path != "" {
		path = &v.Health.Path
	}
	if v.GPUModel != "" {
		model = &v.GPUModel
	}
	_, err = tx.Exec(ctx, `INSERT INTO app_versions (app_slug, version, command, env, port, health_type, health_path,
			health_interval_seconds, health_timeout_seconds, health_failure_threshold, startup_timeout_seconds,
			min_gpu_count, gpu_model, placement, bootstrap_ssh, created_by, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)`,
		slug, v.Version, v.Command, env, v.Port, v.Health.Type, path, v.Health.IntervalSeconds, v.Health.TimeoutSeconds,
		v.Health.FailureThreshold, v.Health.StartupTimeoutSeconds, v.MinGPUCount, model, v.Placement, v.BootstrapSSH, actor, now)
	if db.IsUniqueViolation(err, "app_versions_pkey") {
		return apierr.New(apierr.InvalidRequest, "version %s of app %s exists", v.Version, slug).With("reason", "version_exists").WithStatus(409)
	}
	if err != nil {
		return fmt.Errorf("insert app version: %w", err)
	}
	return nil
}

// lockApp locks the app's row for a change (app_not_found when absent).
func lockApp(ctx context.Context, tx pgx.Tx, slug string) (deprecated bool, err error) {
	var at *time.Time
	err = tx.QueryRow(ctx, `SELECT deprecated_at FROM apps WHERE slug = $1 FOR UPDATE`, slug).Scan(&at)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, appNotFound()
	}
	if err != nil {
		return false, fmt.Errorf("lock app: %w", err)
	}
	return at != nil, nil
}

// UpdateApp changes an app's name, description or kind, and deprecates or restores
// it; audited app.update (app.deprecate / app.restore when that changes).
func (s *Service) UpdateApp(ctx context.Context, slug string, c AppChange) (App, error) {
	now := s.Clock.Now()
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		deprecated, err := lockApp(ctx, tx, slug)
		if err != nil {
			return err
		}
		action, meta := "app.update", map[string]any{}
		depAt := "deprecated_at"
		if c.Deprecated != nil && *c.Deprecated != deprecated {
			if *c.Deprecated {
				action, depAt = "app.deprecate", "$5::timestamptz"
			} else {
				action, depAt = "app.restore", "NULL"
			}
		}
		for k, v := range map[string]*string{"name": c.Name, "description": c.Description, "kind": c.Kind} {
			if v != nil {
				meta[k] = true
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE apps SET name = COALESCE($2, name), description = COALESCE($3, description),
			kind = COALESCE($4, kind), deprecated_at = `+depAt+`, updated_at = $5 WHERE slug = $1`,
			slug, c.Name, c.Description, c.Kind, now); err != nil {
			return fmt.Errorf("update app: %w", err)
		}
		return s.Audit.Record(ctx, tx, audit.Entry{Action: action, TargetType: "app", TargetID: slug, Metadata: meta})
	})
	if err != nil {
		return App{}, err
	}
	return s.GetApp(ctx, uuid.Nil, slug)
}

// CreateVersion adds a version to an app (at most MaxVersionsPerApp), audited
// app.version.create.
func (s *Service) CreateVersion(ctx context.Context, actor uuid.UUID, slug string, v Version) (Version, error) {
	if err := CheckVersion(&v); err != nil {
		return Version{}, err
	}
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		if _, err := lockApp(ctx, tx, slug); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM app_versions WHERE app_slug = $1`, slug).Scan(&n); err != nil {
			return err
		}
		if n >= MaxVersionsPerApp {
			return apierr.Validation("version", "an app has at most %d versions", MaxVersionsPerApp).With("reason", "too_many_versions")
		}
		if err := insertVersion(ctx, tx, slug, v, actor, s.Clock.Now()); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE apps SET updated_at = $2 WHERE slug = $1`, slug, s.Clock.Now()); err != nil {
			return err
		}
		return s.Audit.Record(ctx, tx, audit.Entry{Action: "app.version.create", TargetType: "app_version", TargetID: slug + "@" + v.Version})
	})
	if err != nil {
		return Version{}, err
	}
	return s.GetVersion(ctx, slug, v.Version)
}

// SetVersionDeprecated deprecates or restores a version; a change is audited
// app.version.deprecate / app.version.restore, the same state again writes nothing.
func (s *Service) SetVersionDeprecated(ctx context.Context, slug, version string, deprecated bool) (Version, error) {
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		if _, err := lockApp(ctx, tx, slug); err != nil {
			return err
		}
		var at *time.Time
		err := tx.QueryRow(ctx, `SELECT deprecated_at FROM app_versions WHERE app_slug = $1 AND version = $2 FOR UPDATE`, slug, version).Scan(&at)
		if errors.Is(err, pgx.ErrNoRows) {
			return versionNotFound()
		}
		if err != nil {
			return err
		}
		if (at != nil) == deprecated {
			return nil
		}
		action, value := "app.version.restore", (*time.Time)(nil)
		if deprecated {
			now := s.Clock.Now()
			action, value = "app.version.deprecate", &now
		}
		if _, err := tx.Exec(ctx, `UPDATE app_versions SET deprecated_at = $3 WHERE app_slug = $1 AND version = $2`, slug, version, value); err != nil {
			return err
		}
		return s.Audit.Record(ctx, tx, audit.Entry{Action: action, TargetType: "app_version", TargetID: slug + "@" + version})
	})
	if err != nil {
		return Version{}, err
	}
	return s.GetVersion(ctx, slug, version)
}

// ListEntitlements is a page of an app's entitlements by id.
func (s *Service) ListEntitlements(ctx context.Context, slug string, after uuid.UUID, limit int) ([]Entitlement, bool, error) {
	if _, err := s.GetApp(ctx, uuid.Nil, slug); err != nil {
		return nil, false, err
	}
	rows, err := s.q(ctx).Query(ctx, `SELECT id, app_slug, tenant_id, created_by, created_at FROM app_entitlements
		WHERE app_slug = $1 AND id > $2 ORDER BY id LIMIT $3`, slug, after, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("list entitlements: %w", err)
	}
	defer rows.Close()
	var out []Entitlement
	for rows.Next() {
		var e Entitlement
		var tenant, by uuid.NullUUID
		if err := rows.Scan(&e.ID, &e.AppSlug, &tenant, &by, &e.CreatedAt); err != nil {
			return nil, false, err
		}
		e.TenantID, e.CreatedBy = tenant.UUID, by.UUID
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, false, err
	}
	more := len(out) > limit
	if more {
		out = out[:limit]
	}
	return out, more, nil
}

// Entitle lets tenant (uuid.Nil: every tenant) launch the app, audited app.entitle.
func (s *Service) Entitle(ctx context.Context, actor uuid.UUID, slug string, tenant uuid.UUID) (Entitlement, error) {
	e := Entitlement{ID: s.IDs.New(), AppSlug: slug, TenantID: tenant, CreatedBy: actor, CreatedAt: s.Clock.Now()}
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		if _, err := lockApp(ctx, tx, slug); err != nil {
			return err
		}
		if tenant != uuid.Nil {
			var exists bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM tenants WHERE id = $1)`, tenant).Scan(&exists); err != nil {
				return err
			}
			if !exists {
				return apierr.Validation("tenant_id", "no such tenant").With("reason", "tenant_not_found")
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO app_entitlements (id, app_slug, tenant_id, created_by, created_at) VALUES ($1, $2, $3, $4, $5)`,
			e.ID, slug, nullable(tenant), actor, e.CreatedAt)
		if db.IsUniqueViolation(err, "app_entitlements_app_tenant_key") {
			return apierr.New(apierr.InvalidRequest, "this entitlement exists").With("reason", "entitlement_exists").WithStatus(409)
		}
		if err != nil {
			return fmt.Errorf("insert entitlement: %w", err)
		}
		meta := map[string]any{"all_tenants": tenant == uuid.Nil}
		return s.Audit.Record(ctx, tx, audit.Entry{Action: "app.entitle", TargetType: "app", TargetID: slug, TenantID: tenant, Metadata: meta})
	})
	if err != nil {
		return Entitlement{}, err
	}
	return e, nil
}

// RemoveEntitlement deletes one entitlement of the app, audited app.entitlement.delete.
func (s *Service) RemoveEntitlement(ctx context.Context, slug string, id uuid.UUID) error {
	return db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		var tenant uuid.NullUUID
		err := tx.QueryRow(ctx, `DELETE FROM app_entitlements WHERE id = $1 AND app_slug = $2 RETURNING tenant_id`, id, slug).Scan(&tenant)
		if errors.Is(err, pgx.ErrNoRows) {
			if _, err := lockApp(ctx, tx, slug); err != nil {
				return err
			}
			return apierr.NotFound(apierr.AppNotFound, "entitlement").With("reason", "entitlement_not_found")
		}
		if err != nil {
			return fmt.Errorf("delete entitlement: %w", err)
		}
		return s.Audit.Record(ctx, tx, audit.Entry{Action: "app.entitlement.delete", TargetType: "app", TargetID: slug, TenantID: tenant.UUID,
			Metadata: map[string]any{"entitlement_id": id.String()}})
	})
}
