package storage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/storagedb"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Quota sources.
const (
	SourceTenant   = "tenant"
	SourcePlatform = "platform"
)

// Limits are the quota a project of a tenant gets.
type Limits struct {
	MaxBytes   int64
	MaxObjects int64
	Source     string // SourceTenant or SourcePlatform
	UpdatedAt  *time.Time
}

// Quota is a project's usage and limits.
type Quota struct {
	ProjectID       uuid.UUID
	UsedBytes       int64
	UsedObjects     int64
	ReservedBytes   int64
	ReservedObjects int64
	Limits
}

// TenantLimits is the per-project quota of tenantID: the admin's default for the
// tenant, else the platform's (GANTRY_STORAGE_DEFAULT_QUOTA_*).
func (s *Service) TenantLimits(ctx context.Context, tenantID uuid.UUID) (Limits, error) {
	row, err := s.read(ctx).TenantQuota(ctx, tenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return Limits{MaxBytes: s.Cfg.DefaultQuotaBytes, MaxObjects: s.Cfg.DefaultQuotaObjects, Source: SourcePlatform}, nil
	}
	if err != nil {
		return Limits{}, fmt.Errorf("tenant quota: %w", err)
	}
	at := row.UpdatedAt
	return Limits{MaxBytes: row.MaxBytes, MaxObjects: row.MaxObjects, Source: SourceTenant, UpdatedAt: &at}, nil
}

// ProjectQuota is the project's usage (its storage_quotas row; zero before its first
// upload) and limits.
func (s *Service) ProjectQuota(ctx context.Context, projectID, tenantID uuid.UUID) (Quota, error) {
	lim, err := s.TenantLimits(ctx, tenantID)
	if err != nil {
		return Quota{}, err
	}
	q := Quota{ProjectID: projectID, Limits: lim}
	row, err := s.read(ctx).ProjectQuota(ctx, projectID)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return Quota{}, fmt.Errorf("project quota: %w", err)
	default:
		q.UsedBytes, q.UsedObjects, q.ReservedBytes, q.ReservedObjects = row.UsedBytes, row.UsedObjects, row.ReservedBytes, row.ReservedObjects
	}
	return q, nil
}

// GetTenantLimits is the admin view of a tenant's default (404 for no such tenant).
func (s *Service) GetTenantLimits(ctx context.Context, tenantID uuid.UUID) (Limits, error) {
	ok, err := s.read(ctx).TenantExists(ctx, tenantID)
	if err != nil {
		return Limits{}, fmt.Errorf("tenant: %w", err)
	}
	if !ok {
		return Limits{}, tenantNotFound()
	}
	return s.TenantLimits(ctx, tenantID)
}

// SetTenantLimits sets the tenant's per-project default. It applies at once to every
// project of the tenant; usage above a lowered limit refuses new uploads and deletes
// nothing.
func (s *Service) SetTenantLimits(ctx context.Context, tenantID uuid.UUID, maxBytes, maxObjects int64) (Limits, error) {
	if maxBytes < 0 {
		return Limits{}, apierr.Validation("max_bytes", "max_bytes must be >= 0")
	}
	if maxObjects < 0 {
		return Limits{}, apierr.Validation("max_objects", "max_objects must be >= 0")
	}
	var out Limits
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := storagedb.New(tx)
		ok, err := q.TenantExists(ctx, tenantID)
		if err != nil {
			return fmt.Errorf("tenant: %w", err)
		}
		if !ok {
			return tenantNotFound()
		}
		before, err := s.TenantLimits(db.WithTx(ctx, tx), tenantID)
		if err != nil {
			return err
		}
		row, err := q.UpsertTenantQuota(ctx, storagedb.UpsertTenantQuotaParams{TenantID: tenantID, MaxBytes: maxBytes,
			MaxObjects: maxObjects, UpdatedBy: actorID(ctx), UpdatedAt: s.Clock.Now()})
		if err != nil {
			return fmt.Errorf("upsert tenant quota: %w", err)
		}
		at := row.UpdatedAt
		out = Limits{MaxBytes: row.MaxBytes, MaxObjects: row.MaxObjects, Source: SourceTenant, UpdatedAt: &at}
		if before.Source == SourceTenant && before.MaxBytes == maxBytes && before.MaxObjects == maxObjects {
			return nil // nothing changed: no audit row, no event
		}
		if err := s.Audit.Record(ctx, tx, audit.Entry{Action: "storage.quota.update", TargetType: "tenant", TargetID: tenantID.String(),
			TenantID: tenantID, Metadata: map[string]any{"max_bytes": maxBytes, "max_objects": maxObjects,
				"previous_max_bytes": before.MaxBytes, "previous_max_objects": before.MaxObjects}}); err != nil {
			return err
		}
		return s.enqueue(ctx, tx, EventQuotaUpdated, map[string]any{"tenant_id": tenantID.String(), "max_bytes": maxBytes, "max_objects": maxObjects})
	})
	return out, err
}

// Recount is the project's usage recomputed from its stored objects (the quota
// invariant: it always equals the used_* figures).
func (s *Service) Recount(ctx context.Context, projectID uuid.UUID) (bytes, objects int64, err error) {
	r, err := s.read(ctx).RecountUsage(ctx, projectID)
	if err != nil {
		return 0, 0, fmt.Errorf("recount usage: %w", err)
	}
	return r.Bytes, r.Objects, nil
}

func tenantNotFound() *apierr.Error {
	return apierr.New(apierr.InvalidRequest, "tenant not found").With("reason", "not_found").WithStatus(404)
}
