package storage

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/loop"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/storagedb"
)

// RunSweeper runs Sweep every Cfg.SweepInterval until ctx ends. Every step is one
// transaction that is safe on every replica (SKIP LOCKED, idempotent deletes).
func (s *Service) RunSweeper(ctx context.Context) {
	loop.Every(ctx, s.Cfg.SweepInterval, s.Log, "storage sweep", func(ctx context.Context) error {
		_, err := s.Sweep(ctx)
		return err
	})
}

// SweepResult is what one pass did.
type SweepResult struct {
	ExpiredUploads int
	Blobs          int
	BucketObjects  int64
	Buckets        int
}

// Sweep frees the reservations of uploads that stopped (their blobs queued for
// deletion), removes the objects of buckets being force-deleted in batches (freeing
// quota as it goes) and then the buckets, and deletes queued blobs.
func (s *Service) Sweep(ctx context.Context) (SweepResult, error) {
	var res SweepResult
	n, err := s.sweepUploads(ctx)
	res.ExpiredUploads = n
	if err != nil {
		return res, err
	}
	objs, buckets, err := s.sweepBuckets(ctx)
	res.BucketObjects, res.Buckets = objs, buckets
	if err != nil {
		return res, err
	}
	res.Blobs, err = s.sweepBlobs(ctx)
	return res, err
}

// sweepUploads frees expired reservations: the upload's row goes, its reservation is
// given back and its blob (possibly half written) is queued for deletion.
func (s *Service) sweepUploads(ctx context.Context) (int, error) {
	var n int
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := storagedb.New(tx)
		now := s.Clock.Now()
		rows, err := q.ExpiredUploads(ctx, storagedb.ExpiredUploadsParams{ExpiresAt: now, Limit: int32(s.Cfg.SweepBatch)})
		if err != nil {
			return fmt.Errorf("expired uploads: %w", err)
		}
		for _, u := range rows {
			if err := q.DeleteUploadRow(ctx, u.ID); err != nil {
				return fmt.Errorf("delete upload: %w", err)
			}
			if err := q.FreeReservation(ctx, storagedb.FreeReservationParams{Bytes: u.ReservedBytes, Objects: u.ReservedObjects,
				Now: now, ProjectID: u.ProjectID}); err != nil {
				return fmt.Errorf("free reservation: %w", err)
			}
			if err := q.QueueBlob(ctx, storagedb.QueueBlobParams{BlobKey: u.BlobKey, EnqueuedAt: now}); err != nil {
				return fmt.Errorf("queue blob: %w", err)
			}
		}
		n = len(rows)
		return nil
	})
	if err == nil && n > 0 {
		s.Metrics.swept.WithLabelValues("expired_upload").Add(float64(n))
		s.Log.InfoContext(ctx, "storage: freed expired upload reservations", "count", n)
	}
	return n, err
}

// sweepBuckets works on buckets being force-deleted, one batch of objects per bucket
// per pass; a bucket with no objects and no uploads left is deleted.
func (s *Service) sweepBuckets(ctx context.Context) (int64, int, error) {
	rows, err := s.read(ctx).DeletingBuckets(ctx, int32(s.Cfg.SweepBatch))
	if err != nil {
		return 0, 0, fmt.Errorf("deleting buckets: %w", err)
	}
	var (
		objects int64
		buckets int
		errs    []error
	)
	for _, b := range rows {
		n, gone, err := s.sweepBucket(ctx, b)
		objects += n
		if gone {
			buckets++
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return objects, buckets, errors.Join(errs...)
}

func (s *Service) sweepBucket(ctx context.Context, row storagedb.StorageBucket) (int64, bool, error) {
	var (
		removed int64
		gone    bool
	)
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := storagedb.New(tx)
		if _, err := q.LockDeletingBucket(ctx, row.ID); errors.Is(err, pgx.ErrNoRows) {
			return nil // another replica has it, or it is gone
		} else if err != nil {
			return fmt.Errorf("lock deleting bucket: %w", err)
		}
		now := s.Clock.Now()
		batch, err := q.DeleteObjectBatch(ctx, storagedb.DeleteObjectBatchParams{Bucket: row.ID, N: int32(s.Cfg.SweepBatch), Now: now})
		if err != nil {
			return fmt.Errorf("delete objects: %w", err)
		}
		if batch.Objects > 0 {
			removed = batch.Objects
			return q.FreeUsage(ctx, storagedb.FreeUsageParams{Bytes: batch.Bytes, Objects: batch.Objects, Now: now, ProjectID: row.ProjectID})
		}
		uploads, err := q.BucketHasUploads(ctx, row.ID)
		if err != nil || uploads {
			return err // uploads in flight end (or expire) first
		}
		if err := q.DeleteBucketRow(ctx, row.ID); err != nil {
			return fmt.Errorf("delete bucket: %w", err)
		}
		gone = true
		b := Bucket{ID: row.ID, TenantID: row.TenantID, ProjectID: row.ProjectID, BucketID: row.BucketID, State: row.State}
		e := bucketAudit("storage.bucket.deleted", b, nil)
		e.ActorType = audit.ActorSystem
		if err := s.Audit.Record(ctx, tx, e); err != nil {
			return err
		}
		return s.enqueue(ctx, tx, EventBucketDeleted, bucketPayload(b))
	})
	if err != nil {
		return 0, false, err
	}
	if removed > 0 {
		s.Metrics.swept.WithLabelValues("bucket_object").Add(float64(removed))
		s.Metrics.objectsDeleted.Add(float64(removed))
	}
	if gone {
		s.Metrics.swept.WithLabelValues("bucket").Inc()
	}
	return removed, gone, nil
}

// sweepBlobs deletes queued blobs, then their queue rows (a blob deleted twice is no
// error, so a crash between the two only repeats work).
func (s *Service) sweepBlobs(ctx context.Context) (int, error) {
	if s.Blobs == nil {
		return 0, nil
	}
	keys, err := s.read(ctx).GarbageBlobs(ctx, storagedb.GarbageBlobsParams{EnqueuedAt: s.Clock.Now(), Limit: int32(s.Cfg.SweepBatch)})
	if err != nil {
		return 0, fmt.Errorf("garbage blobs: %w", err)
	}
	n := 0
	for _, k := range keys {
		if err := s.Blobs.Delete(ctx, k); err != nil {
			return n, fmt.Errorf("delete blob: %w", err)
		}
		if err := s.read(ctx).UnqueueBlob(ctx, k); err != nil {
			return n, fmt.Errorf("unqueue blob: %w", err)
		}
		n++
	}
	if n > 0 {
		s.Metrics.swept.WithLabelValues("blob").Add(float64(n))
	}
	return n, nil
}
