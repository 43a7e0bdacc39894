package objects

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/objects/objectsdb"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Limits are the platform's default quota per project, used where the tenant has none
// (storage_tenant_quotas, set by an admin).
type Limits struct {
	MaxBytes   int64
	MaxObjects int64
}

// reservation is one upload's hold on the project's quota (a storage_uploads row).
type reservation struct {
	id      uuid.UUID
	bucket  Bucket
	blobKey string
	bytes   int64
	touched time.Time
}

// reserve opens the upload's reservation of bytes and one object in one transaction:
// the conditional UPDATE of the project's usage and the storage_uploads row. chunked
// is reported in the refusal's details (both are 429 quota_exhausted).
func (s *Store) reserve(ctx context.Context, b Bucket, id uuid.UUID, blobKey string, bytes int64, chunked bool) (*reservation, error) {
	ctx, cancel := s.step(ctx)
	defer cancel()
	now := s.Clock.Now()
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := objectsdb.New(tx)
		if err := q.EnsureQuota(ctx, objectsdb.EnsureQuotaParams{ProjectID: b.ProjectID, TenantID: b.TenantID, UpdatedAt: now}); err != nil {
			return fmt.Errorf("ensure quota row: %w", err)
		}
		if err := s.reserveIn(ctx, q, b, bytes, 1, chunked); err != nil {
			return err
		}
		return q.InsertUpload(ctx, objectsdb.InsertUploadParams{
			ID: id, ProjectID: b.ProjectID, Bucket: b.ID, BlobKey: blobKey, ReservedBytes: bytes, ReservedObjects: 1,
			StartedAt: now, ExpiresAt: now.Add(s.Config.UploadTTL),
		})
	})
	if err != nil {
		return nil, err
	}
	return &reservation{id: id, bucket: b, blobKey: blobKey, bytes: bytes, touched: now}, nil
}

func (s *Store) reserveIn(ctx context.Context, q *objectsdb.Queries, b Bucket, bytes, objects int64, chunked bool) error {
	_, err := q.ReserveQuota(ctx, objectsdb.ReserveQuotaParams{
		Bytes: bytes, Objects: objects, Now: s.Clock.Now(), ProjectID: b.ProjectID,
		DefaultMaxBytes: s.Limits.MaxBytes, DefaultMaxObjects: s.Limits.MaxObjects,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		s.Metrics.QuotaRefused()
		// 429 whether the size was declared or a chunked body grew past the quota
		// (ARCHITECTURE §3); chunked says which in details.
		return apierr.New(apierr.StorageQuotaExceeded, "the project's storage quota cannot hold this upload").
			With("reason", "quota_exhausted").With("requested_bytes", bytes).With("chunked", chunked)
	}
	if err != nil {
		return fmt.Errorf("reserve quota: %w", err)
	}
	return nil
}

// grow adds bytes to the reservation of a chunked upload.
func (s *Store) grow(ctx context.Context, r *reservation, bytes int64) error {
	ctx, cancel := s.step(ctx)
	defer cancel()
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := objectsdb.New(tx)
		if err := s.reserveIn(ctx, q, r.bucket, bytes, 0, true); err != nil {
			return err
		}
		n, err := q.GrowUpload(ctx, objectsdb.GrowUploadParams{ID: r.id, Bytes: bytes, ExpiresAt: s.Clock.Now().Add(s.Config.UploadTTL)})
		if err != nil {
			return fmt.Errorf("grow upload: %w", err)
		}
		if n == 0 {
			return errReservationLost()
		}
		return nil
	})
	if err == nil {
		r.bytes += bytes
		r.touched = s.Clock.Now()
	}
	return err
}

// refresh moves the reservation's expiry (Config.UploadTTL) on while bytes keep
// arriving, at most once a minute, so a long upload with a Content-Length is not taken
// for a dead one.
func (s *Store) refresh(ctx context.Context, r *reservation) error {
	now := s.Clock.Now()
	if now.Sub(r.touched) < time.Minute {
		return nil
	}
	ctx, cancel := s.step(ctx)
	defer cancel()
	n, err := objectsdb.New(s.Pool).ExtendUpload(ctx, objectsdb.ExtendUploadParams{ID: r.id, ExpiresAt: now.Add(s.Config.UploadTTL)})
	if err != nil {
		return fmt.Errorf("extend upload: %w", err)
	}
	if n == 0 {
		return errReservationLost()
	}
	r.touched = now
	return nil
}

// release frees the reservation of an upload that ends without a commit. It runs on a
// context of its own: the request's has often ended (the client left).
func (s *Store) release(ctx context.Context, r *reservation) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.Config.StepTimeout)
	defer cancel()
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := objectsdb.New(tx)
		up, err := q.DeleteUpload(ctx, r.id)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // the sweeper has freed it already
		}
		if err != nil {
			return err
		}
		_, err = q.SettleQuota(ctx, objectsdb.SettleQuotaParams{ProjectID: up.ProjectID,
			ReservedBytes: up.ReservedBytes, ReservedObjects: up.ReservedObjects, Now: s.Clock.Now()})
		return err
	})
	if err != nil {
		// The row stays; the sweeper frees it when it expires.
		s.Log.Warn("storage: could not free an upload's reservation", "upload_id", r.id, "error", err)
	}
}

// errReservationLost: the sweeper took the reservation for a dead upload's (the
// control plane could not refresh it in time). The upload is refused, not committed
// outside the quota.
func errReservationLost() error {
	return apierr.New(apierr.ServiceUnavailable, "the upload's quota reservation expired; retry the upload").
		With("reason", "reservation_expired")
}
