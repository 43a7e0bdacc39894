package objects

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/objects/objectsdb"
)

// Delete removes the object at path of bucket b (ifMatch: only while its ETag is one
// of these). One transaction removes the row, frees its quota, queues its blob and
// writes the audit row; the blob is deleted after the commit.
func (s *Store) Delete(ctx context.Context, b Bucket, path, ifMatch string, actor Actor) error {
	ctx, cancel := s.step(ctx)
	defer cancel()
	var key string
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := objectsdb.New(tx)
		cur, err := q.LockObject(ctx, objectsdb.LockObjectParams{Bucket: b.ID, Path: path})
		if errors.Is(err, pgx.ErrNoRows) {
			return errNotFound(path)
		}
		if err != nil {
			return fmt.Errorf("lock object: %w", err)
		}
		if ifMatch != "" && !matches(ifMatch, cur.Etag, true) {
			return errPreconditionFailed()
		}
		if err := q.DeleteObject(ctx, objectsdb.DeleteObjectParams{Bucket: b.ID, Path: path}); err != nil {
			return fmt.Errorf("delete object: %w", err)
		}
		now := s.Clock.Now()
		if _, err := q.SettleQuota(ctx, objectsdb.SettleQuotaParams{ProjectID: cur.ProjectID, UsedBytes: -cur.SizeBytes,
			UsedObjects: -1, Now: now}); err != nil {
			return fmt.Errorf("free quota: %w", err)
		}
		if err := q.QueueBlob(ctx, objectsdb.QueueBlobParams{BlobKey: cur.BlobKey, EnqueuedAt: now}); err != nil {
			return fmt.Errorf("queue blob: %w", err)
		}
		key = cur.BlobKey
		meta := map[string]any{"bucket_id": b.BucketID, "path": path, "size_bytes": cur.SizeBytes, "etag": cur.Etag}
		return s.Audit.Record(ctx, tx, auditEntry(actor, "storage.object.delete", b, meta))
	})
	if err != nil {
		return err
	}
	s.collect(ctx, key)
	s.Metrics.ObjectDeleted()
	return nil
}

// List is a page of the bucket's objects under prefix (cleaned), folded at delimiter
// ("" or "/"), from position from (nil: the start).
func (s *Store) List(ctx context.Context, b Bucket, prefix, delimiter string, from *Position, limit int) (ListPage, error) {
	ctx, cancel := s.step(ctx)
	defer cancel()
	q := s.read(ctx)
	var end *string
	if prefix != "" {
		e := successor(prefix)
		end = &e
	}
	fetch := func(ctx context.Context, start string, inclusive bool, prefix string, n int) ([]ObjectInfo, error) {
		var skip *string
		if !inclusive {
			skip = &start
		}
		rows, err := q.ListObjects(ctx, objectsdb.ListObjectsParams{Bucket: b.ID, Start: start, Skip: skip,
			Prefix: prefix, PrefixEnd: end, Lim: int32(n)})
		if err != nil {
			return nil, fmt.Errorf("list objects: %w", err)
		}
		out := make([]ObjectInfo, len(rows))
		for i, r := range rows { // a listing's entries carry what it answers, no blob key
			out[i] = ObjectInfo{Path: r.Path, SizeBytes: r.SizeBytes, ETag: r.Etag, ContentType: r.ContentType, UpdatedAt: r.UpdatedAt}
		}
		return out, nil
	}
	if delimiter != "" {
		return s.listFolded(ctx, b, prefix, delimiter, from, limit, fetch)
	}
	return list(ctx, fetch, prefix, delimiter, from, limit)
}
