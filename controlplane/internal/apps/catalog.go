package apps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// MaxVersionsPerApp bounds an app's versions (App.versions is at most 200 long).
const MaxVersionsPerApp = 200

// Placements.
const (
	PlacementInstance        = "instance"
	PlacementWholeAllocation = "whole_allocation"
)

// Health check defaults (AppVersionSpec).
const (
	DefaultHealthInterval       = 10
	DefaultHealthTimeout        = 5
	DefaultHealthFailures       = 3
	DefaultStartupTimeoutSecond = 300
)

// App is a catalog app with its versions, oldest first.
type App struct {
	Slug         string
	Name         string
	Description  string
	Kind         string
	DeprecatedAt *time.Time
	// Entitled: for the tenant asked about (an entitlement of it or of every tenant);
	// in the admin listing, whether an all-tenants entitlement exists.
	Entitled  bool
	Versions  []VersionSummary
	CreatedAt time.Time
	UpdatedAt time.Time
}

// VersionSummary is one version in an app's listing.
type VersionSummary struct {
	Version      string
	DeprecatedAt *time.Time
	CreatedAt    time.Time
}

// Latest is the newest version that is not deprecated ("" when none).
func (a App) Latest() string {
	for i := len(a.Versions) - 1; i >= 0; i-- {
		if a.Versions[i].DeprecatedAt == nil {
			return a.Versions[i].Version
		}
	}
	return ""
}

// EnvVar is one variable of a version's environment.
type EnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// HealthCheck is how the node agent decides that the app is healthy.
type HealthCheck struct {
	Type                  string // "http" or "tcp"
	Path                  string // http only
	IntervalSeconds       int
	TimeoutSeconds        int
	FailureThreshold      int
	StartupTimeoutSeconds int
}

// Version is how one version of an app runs on a node.
type Version struct {
	AppSlug      string
	Version      string
	Command      []string
	Env          []EnvVar
	Port         int
	Health       HealthCheck
	MinGPUCount  int
	GPUModel     string // "" any
	Placement    string
	BootstrapSSH bool
	DeprecatedAt *time.Time
	CreatedAt    time.Time
}

// Launchable is what a launch needs: the version and the app it belongs to.
type Launchable struct {
	AppName string
	Kind    string
	Version
}

// Service is the catalog.
type Service struct {
	Pool  *pgxpool.Pool
	Clock clock.Clock
	IDs   ids.Source
	Audit *audit.Log
}

// New returns the catalog over pool.
func New(pool *pgxpool.Pool, clk clock.Clock, idSrc ids.Source) *Service {
	return &Service{Pool: pool, Clock: clk, IDs: idSrc, Audit: &audit.Log{Clock: clk, IDs: idSrc}}
}

func (s *Service) q(ctx context.Context) interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
	QueryRow(context.Context, string, ...any) pgx.Row
} {
	return db.Querier(ctx, s.Pool)
}

func appNotFound() *apierr.Error { return apierr.NotFound(apierr.AppNotFound, "app") }
func versionNotFound() *apierr.Error {
	return apierr.NotFound(apierr.AppVersionNotFound, "app version")
}

// entitledSQL is true when tenant $1 (NULL: only an all-tenants entitlement counts) may
// launch app a.
const entitledSQL = `EXISTS (SELECT 1 FROM app_entitlements e WHERE e.app_slug = a.slug
	AND (e.tenant_id IS NULL OR e.tenant_id = $1))`

// ListApps is a page of apps by slug after `after`, with Entitled for tenant (uuid.Nil:
// the admin listing, where only an all-tenants entitlement counts).
func (s *Service) ListApps(ctx context.Context, tenant uuid.UUID, after string, limit int) ([]App, bool, error) {
	rows, err := s.q(ctx).Query(ctx, `SELECT a.slug, a.name, a.description, a.kind, a.deprecated_at, a.created_at, a.updated_at, `+entitledSQL+`
		FROM apps a WHERE a.slug > $2 ORDER BY a.slug LIMIT $3`, nullable(tenant), after, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("list apps: %w", err)
	}
	var out []App
	for rows.Next() {
		var a App
		if err := rows.Scan(&a.Slug, &a.Name, &a.Description, &a.Kind, &a.DeprecatedAt, &a.CreatedAt, &a.UpdatedAt, &a.Entitled); err != nil {
			rows.Close()
			return nil, false, err
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("list apps: %w", err)
	}
	more := len(out) > limit
	if more {
		out = out[:limit]
	}
	if err := s.fillVersions(ctx, out); err != nil {
		return nil, false, err
	}
	return out, more, nil
}

func (s *Service) fillVersions(ctx context.Context, list []App) error {
	if len(list) == 0 {
		return nil
	}
	slugs := make([]string, len(list))
	at := make(map[string]int, len(list))
	for i, a := range list {
		slugs[i], at[a.Slug] = a.Slug, i
	}
	rows, err := s.q(ctx).Query(ctx, `SELECT app_slug, version, deprecated_at, created_at FROM app_versions
		WHERE app_slug = ANY($1) ORDER BY app_slug, seq`, slugs)
	if err != nil {
		return fmt.Errorf("app versions: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var slug string
		var v VersionSummary
		if err := rows.Scan(&slug, &v.Version, &v.DeprecatedAt, &v.CreatedAt); err != nil {
			return err
		}
		list[at[slug]].Versions = append(list[at[slug]].Versions, v)
	}
	return rows.Err()
}

// GetApp loads one app with its versions (Entitled for tenant, as ListApps).
func (s *Service) GetApp(ctx context.Context, tenant uuid.UUID, slug string) (App, error) {
	var a App
	err := s.q(ctx).QueryRow(ctx, `SELECT a.slug, a.name, a.description, a.kind, a.deprecated_at, a.created_at, a.updated_at, `+entitledSQL+`
		FROM apps a WHERE a.slug = $2`, nullable(tenant), slug).
		Scan(&a.Slug, &a.Name, &a.Description, &a.Kind, &a.DeprecatedAt, &a.CreatedAt, &a.UpdatedAt, &a.Entitled)
	if errors.Is(err, pgx.ErrNoRows) {
		return App{}, appNotFound()
	}
	if err != nil {
		return App{}, fmt.Errorf("get app: %w", err)
	}
	list := []App{a}
	if err := s.fillVersions(ctx, list); err != nil {
		return App{}, err
	}
	return list[0], nil
}

const versionColumns = `app_slug, version, command, env, port, health_type, COALESCE(health_path, ''), health_interval_seconds,
	health_timeout_seconds, health_failure_threshold, startup_timeout_seconds, min_gpu_count, COALESCE(gpu_model, ''), placement,
	bootstrap_ssh, deprecated_at, created_at`

func scanVersion(row pgx.Row) (Version, error) {
	var v Version
	var env []byte
	err := row.Scan(&v.AppSlug, &v.Version, &v.Command, &env, &v.Port, &v.Health.Type, &v.Health.Path, &v.Health.IntervalSeconds,
		&v.Health.TimeoutSeconds, &v.Health.FailureThreshold, &v.Health.StartupTimeoutSeconds, &v.MinGPUCount, &v.GPUModel, &v.Placement,
		&v.BootstrapSSH, &v.DeprecatedAt, &v.CreatedAt)
	if err != nil {
		return Version{}, err
	}
	if err := json.Unmarshal(env, &v.Env); err != nil {
		return Version{}, fmt.Errorf("app version env: %w", err)
	}
	if v.Env == nil {
		v.Env = []EnvVar{}
	}
	return v, nil
}

// GetVersion loads one version: app_not_found when the app does not exist,
// app_version_not_found when the version does not. Deprecated ones are returned.
func (s *Service) GetVersion(ctx context.Context, slug, version string) (Version, error) {
	v, err := scanVersion(s.q(ctx).QueryRow(ctx, `SELECT `+versionColumns+` FROM app_versions WHERE app_slug = $1 AND version = $2`, slug, version))
	if errors.Is(err, pgx.ErrNoRows) {
		var exists bool
		if err := s.q(ctx).QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM apps WHERE slug = $1)`, slug).Scan(&exists); err != nil {
			return Version{}, fmt.Errorf("get app: %w", err)
		}
		if !exists {
			return Version{}, appNotFound()
		}
		return Version{}, versionNotFound()
	}
	if err != nil {
		return Version{}, fmt.Errorf("get app version: %w", err)
	}
	return v, nil
}

// LaunchVersion answers whether a caller of tenant may launch slug@version, in the
// order docs/apps.md gives: the app exists and is not deprecated (app_not_found), the
// version exists and is not deprecated (app_version_not_found; details.reason
// deprecated for a deprecated one), the tenant is entitled (app_not_entitled).
func (s *Service) LaunchVersion(ctx context.Context, tenant uuid.UUID, slug, version string) (Launchable, error) {
	var l Launchable
	var appDeprecated *time.Time
	var entitled bool
	err := s.q(ctx).QueryRow(ctx, `SELECT a.name, a.kind, a.deprecated_at, `+entitledSQL+` FROM apps a WHERE a.slug = $2`,
		nullable(tenant), slug).Scan(&l.AppName, &l.Kind, &appDeprecated, &entitled)
	if errors.Is(err, pgx.ErrNoRows) {
		return Launchable{}, appNotFound()
	}
	if err != nil {
		return Launchable{}, fmt.Errorf("launch version: %w", err)
	}
	if appDeprecated != nil {
		return Launchable{}, appNotFound().With("reason", "deprecated")
	}
	v, err := s.GetVersion(ctx, slug, version)
	if err != nil {
		return Launchable{}, err
	}
	if v.DeprecatedAt != nil {
		return Launchable{}, versionNotFound().With("reason", "deprecated")
	}
	if tenant == uuid.Nil || !entitled {
		return Launchable{}, apierr.New(apierr.AppNotEntitled, "the tenant is not entitled to app %s", slug)
	}
	l.Version = v
	return l, nil
}

func nullable(id uuid.UUID) uuid.NullUUID { return uuid.NullUUID{UUID: id, Valid: id != uuid.Nil} }
