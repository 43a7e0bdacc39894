package storage

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/storagedb"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// BucketIDPattern is the seed's bucket_id rule (§4.1).
var BucketIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9:_./-]{0,127}$`)

// Event types (outbox; subjects gantry.events.<type>).
const (
	EventBucketCreated  = "storage.bucket.created"
	EventBucketDeleting = "storage.bucket.deleting"
	EventBucketDeleted  = "storage.bucket.deleted"
	EventGrantCreated   = "storage.grant.created"
	EventGrantRevoked   = "storage.grant.revoked"
	EventQuotaUpdated   = "storage.quota.updated"
)

// BucketView is a bucket with its size and object count.
type BucketView struct {
	Bucket
	SizeBytes   int64
	ObjectCount int64
}

// CreateBucket creates an empty bucket bucketID in the caller's project.
func (s *Service) CreateBucket(ctx context.Context, proj projectctx.Project, bucketID string) (BucketView, error) {
	if !BucketIDPattern.MatchString(bucketID) {
		return BucketView{}, apierr.Validation("bucket_id", "bucket_id must be 1..128 characters of A-Z a-z 0-9 : _ . / - starting with a letter or digit")
	}
	var out BucketView
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		now := s.Clock.Now()
		row, err := storagedb.New(tx).InsertBucket(ctx, storagedb.InsertBucketParams{
			ID: s.IDs.New(), TenantID: proj.TenantID, ProjectID: proj.ID, BucketID: bucketID,
			CreatedBy: actorID(ctx), CreatedAt: now,
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return apierr.New(apierr.StorageAlreadyExists, "a bucket %q already exists in this project", bucketID).
				With("field", "bucket_id").With("bucket_id", bucketID)
		}
		if err != nil {
			return fmt.Errorf("insert bucket: %w", err)
		}
		out = BucketView{Bucket: Bucket{ID: row.ID, TenantID: row.TenantID, ProjectID: row.ProjectID, BucketID: row.BucketID,
			State: row.State, CreatedBy: row.CreatedBy, CreatedAt: row.CreatedAt, UpdatedAt: row.UpdatedAt, Access: ReadWrite}}
		if err := s.Audit.Record(ctx, tx, bucketAudit("storage.bucket.create", out.Bucket, nil)); err != nil {
			return err
		}
		return s.enqueue(ctx, tx, EventBucketCreated, bucketPayload(out.Bucket))
	})
	return out, err
}

// ListBuckets is a page of the project's buckets after bucket_id after ("" first).
func (s *Service) ListBuckets(ctx context.Context, projectID uuid.UUID, after string, limit int) ([]BucketView, bool, error) {
	rows, err := s.read(ctx).ListBuckets(ctx, storagedb.ListBucketsParams{ProjectID: projectID, After: after, Limit: int32(limit + 1)})
	if err != nil {
		return nil, false, fmt.Errorf("list buckets: %w", err)
	}
	more := len(rows) > limit
	if more {
		rows = rows[:limit]
	}
	out := make([]BucketView, 0, len(rows))
	for _, r := range rows {
		out = append(out, BucketView{Bucket: Bucket{ID: r.ID, TenantID: r.TenantID, ProjectID: r.ProjectID, BucketID: r.BucketID,
			State: r.State, CreatedBy: r.CreatedBy, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, Access: ReadWrite},
			SizeBytes: r.SizeBytes, ObjectCount: r.ObjectCount})
	}
	return out, more, nil
}

// GetBucket is one bucket the caller may read, with its size and count. Owner-project
// members also see a bucket that is being force-deleted.
func (s *Service) GetBucket(ctx context.Context, caller *principal.Principal, ownerProject uuid.UUID, bucketID string) (BucketView, error) {
	b, err := s.resolve(ctx, caller, ownerProject, bucketID, nil)
	if err != nil {
		return BucketView{}, err
	}
	if b.Access == "" || (b.State != StateActive && !s.isMember(ctx, ownerProject)) {
		return BucketView{}, BucketNotFound(bucketID)
	}
	st, err := s.read(ctx).BucketStats(ctx, b.ID)
	if err != nil {
		return BucketView{}, fmt.Errorf("bucket stats: %w", err)
	}
	return BucketView{Bucket: b, SizeBytes: st.SizeBytes, ObjectCount: st.ObjectCount}, nil
}

// isMember reports whether the request's project context is ownerProject with a role.
func (s *Service) isMember(ctx context.Context, ownerProject uuid.UUID) bool {
	p, ok := projectctx.From(ctx)
	return ok && p.ID == ownerProject && p.Role != ""
}

// DeleteBucket deletes an empty bucket at once (deleted true). A bucket that holds
// objects (or uploads in flight) is refused with 409 unless force, which marks it
// deleting: the sweeper then removes its objects in batches, freeing quota as it goes,
// and finally the bucket (deleted false, the bucket as it now is).
func (s *Service) DeleteBucket(ctx context.Context, proj projectctx.Project, bucketID string, force bool) (BucketView, bool, error) {
	var (
		out     BucketView
		deleted bool
	)
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := storagedb.New(tx)
		row, err := q.LockBucket(ctx, storagedb.LockBucketParams{ProjectID: proj.ID, BucketID: bucketID})
		if errors.Is(err, pgx.ErrNoRows) {
			return BucketNotFound(bucketID)
		}
		if err != nil {
			return fmt.Errorf("lock bucket: %w", err)
		}
		b := Bucket{ID: row.ID, TenantID: row.TenantID, ProjectID: row.ProjectID, BucketID: row.BucketID, State: row.State,
			CreatedBy: row.CreatedBy, CreatedAt: row.CreatedAt, UpdatedAt: row.UpdatedAt, Access: ReadWrite}
		st, err := q.BucketStats(ctx, b.ID)
		if err != nil {
			return fmt.Errorf("bucket stats: %w", err)
		}
		out = BucketView{Bucket: b, SizeBytes: st.SizeBytes, ObjectCount: st.ObjectCount}
		if b.State == StateDeleting { // asked again: already on its way
			if !force {
				return apierr.New(apierr.InvalidRequest, "bucket %q is already being deleted", bucketID).
					With("reason", "bucket_deleting").WithStatus(409)
			}
			return nil
		}
		uploads, err := q.BucketHasUploads(ctx, b.ID)
		if err != nil {
			return fmt.Errorf("bucket uploads: %w", err)
		}
		if st.ObjectCount == 0 && !uploads {
			if err := q.DeleteBucketRow(ctx, b.ID); err != nil {
				return fmt.Errorf("delete bucket: %w", err)
			}
			deleted = true
			if err := s.Audit.Record(ctx, tx, bucketAudit("storage.bucket.delete", b, map[string]any{"force": force})); err != nil {
				return err
			}
			return s.enqueue(ctx, tx, EventBucketDeleted, bucketPayload(b))
		}
		if !force {
			reason := "bucket_not_empty"
			if st.ObjectCount == 0 {
				reason = "uploads_in_progress"
			}
			return apierr.New(apierr.InvalidRequest, "bucket %q is not empty: delete its objects first, or delete it with force=true", bucketID).
				With("reason", reason).With("object_count", st.ObjectCount).WithStatus(409)
		}
		now := s.Clock.Now()
		marked, err := q.MarkBucketDeleting(ctx, storagedb.MarkBucketDeletingParams{ID: b.ID, DeleteRequestedAt: &now})
		if err != nil {
			return fmt.Errorf("mark bucket deleting: %w", err)
		}
		out.State, out.UpdatedAt = marked.State, marked.UpdatedAt
		meta := map[string]any{"force": true, "object_count": st.ObjectCount, "size_bytes": st.SizeBytes}
		if err := s.Audit.Record(ctx, tx, bucketAudit("storage.bucket.delete", out.Bucket, meta)); err != nil {
			return err
		}
		return s.enqueue(ctx, tx, EventBucketDeleting, bucketPayload(out.Bucket))
	})
	return out, deleted, err
}

func bucketAudit(action string, b Bucket, meta map[string]any) audit.Entry {
	if meta == nil {
		meta = map[string]any{}
	}
	meta["bucket_id"] = b.BucketID
	return audit.Entry{Action: action, TargetType: "storage_bucket", TargetID: b.ID.String(), TenantID: b.TenantID,
		ProjectID: b.ProjectID, Metadata: meta}
}

func bucketPayload(b Bucket) map[string]any {
	return map[string]any{"bucket": b.ID.String(), "bucket_id": b.BucketID, "project_id": b.ProjectID.String(),
		"tenant_id": b.TenantID.String()}
}

func (s *Service) enqueue(ctx context.Context, tx pgx.Tx, typ string, payload map[string]any) error {
	if _, err := s.Outbox.Enqueue(ctx, tx, outboxEvent(typ, payload)); err != nil {
		return fmt.Errorf("enqueue %s: %w", typ, err)
	}
	return nil
}

// actorID is the caller's user id (a machine identity's own users row), if any.
func actorID(ctx context.Context) uuid.NullUUID {
	if p, ok := principal.From(ctx); ok && p.UserID != uuid.Nil {
		return uuid.NullUUID{UUID: p.UserID, Valid: true}
	}
	return uuid.NullUUID{}
}
