package objects

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/blob"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/objects/objectsdb"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// PutInput is one upload.
type PutInput struct {
	Path        string // cleaned (objpath.Clean)
	Body        io.Reader
	Size        int64 // Content-Length, or -1 for a body of unknown length
	ContentType string
	Pre         Preconditions
	Actor       Actor
}

// Actor names who writes when the context carries no user (the node fabric's writes
// for an attachment); its fields go into the audit row.
type Actor struct {
	Type     string         // audit.ActorNode, ...; "" takes the context's principal
	Metadata map[string]any // e.g. attachment_id, node_id
}

// Put stores in.Body as the object at in.Path of bucket b (see the package doc for
// the steps). It returns the committed object.
func (s *Store) Put(ctx context.Context, b Bucket, in PutInput) (ObjectInfo, error) {
	if in.ContentType == "" {
		in.ContentType = DefaultContentType
	}
	if len(in.ContentType) > 255 || !utf8.ValidString(in.ContentType) {
		return ObjectInfo{}, apierr.Validation("Content-Type", "Content-Type is longer than 255 bytes or not valid text")
	}
	if in.Size > s.Config.MaxObjectBytes {
		s.Metrics.QuotaRefused()
		return ObjectInfo{}, errTooLarge(s.Config.MaxObjectBytes)
	}
	// Fail fast on preconditions before any byte is read; the commit decides again.
	if in.Pre.IfMatch != "" || in.Pre.IfNoneMatch != "" {
		cur, err := s.Stat(ctx, b, in.Path)
		exists := err == nil
		if err != nil && !isNotFound(err) {
			return ObjectInfo{}, err
		}
		if err := writeOutcome(in.Pre.evaluate(exists, cur.ETag, cur.UpdatedAt, false), in.Path); err != nil {
			return ObjectInfo{}, err
		}
	}

	version := s.IDs.New()
	key := blob.Key(b.TenantID, b.ProjectID, b.ID, version)
	initial := in.Size
	if initial < 0 {
		initial = min(s.Config.ReserveStep, s.Config.MaxObjectBytes)
	}
	res, err := s.reserve(ctx, b, version, key, initial, in.Size < 0)
	if err != nil {
		return ObjectInfo{}, err
	}
	committed := false
	defer func() {
		if !committed {
			s.release(ctx, res)
		}
	}()

	body := &meteredBody{ctx: ctx, r: in.Body, size: in.Size, limit: s.Config.MaxObjectBytes, reserved: res.bytes,
		step: s.Config.ReserveStep, store: s, res: res}
	put, err := s.Blob.Put(ctx, key, body, in.Size)
	if err != nil {
		s.discard(ctx, key) // a driver leaves nothing on failure; this is the second line
		return ObjectInfo{}, uploadError(body, err)
	}
	s.Metrics.BytesIn(put.Size)

	o, err := s.commit(ctx, b, in, res, key, put)
	if err != nil {
		s.discard(ctx, key)
		return ObjectInfo{}, err
	}
	committed = true
	return o, nil
}

// uploadError is the error a failed Put answers: the body's own refusal (too large,
// quota, length) when it made the driver stop, else what the driver said.
func uploadError(body *meteredBody, err error) error {
	if body.err != nil {
		return body.err
	}
	if errors.Is(err, blob.ErrSizeMismatch) {
		return errBodyLength(body.size, body.got, "shorter or longer")
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return errBodyRead(err)
	}
	return fmt.Errorf("store object bytes: %w", err)
}

// commit makes the upload the object at in.Path in one transaction.
func (s *Store) commit(ctx context.Context, b Bucket, in PutInput, res *reservation, key string, put blob.PutResult) (ObjectInfo, error) {
	ctx, cancel := s.step(context.WithoutCancel(ctx))
	defer cancel()
	etag := ETag(put.SHA256)
	var out ObjectInfo
	var replaced string
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := objectsdb.New(tx)
		if err := lockActiveBucket(ctx, q, b); err != nil {
			return err
		}
		now := s.Clock.Now()
		createdBy := actorUser(ctx)
		for {
			cur, err := q.LockObject(ctx, objectsdb.LockObjectParams{Bucket: b.ID, Path: in.Path})
			exists := err == nil
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("lock object: %w", err)
			}
			if err := writeOutcome(in.Pre.evaluate(exists, cur.Etag, cur.UpdatedAt, false), in.Path); err != nil {
				return err
			}
			var row objectsdb.StorageObject
			if exists {
				row, err = q.ReplaceObject(ctx, objectsdb.ReplaceObjectParams{Bucket: b.ID, Path: in.Path, BlobKey: key,
					SizeBytes: put.Size, Etag: etag, ContentType: in.ContentType, CreatedBy: createdBy, UpdatedAt: now})
				replaced = cur.BlobKey
			} else {
				row, err = q.InsertObject(ctx, objectsdb.InsertObjectParams{Bucket: b.ID, Path: in.Path, ProjectID: b.ProjectID,
					BlobKey: key, SizeBytes: put.Size, Etag: etag, ContentType: in.ContentType, CreatedBy: createdBy, CreatedAt: now})
				if errors.Is(err, pgx.ErrNoRows) {
					continue // a concurrent first PUT committed the path: lock it and decide again
				}
			}
			if err != nil {
				return fmt.Errorf("write object row: %w", err)
			}
			up, err := q.DeleteUpload(ctx, res.id)
			if errors.Is(err, pgx.ErrNoRows) {
				return errReservationLost()
			}
			if err != nil {
				return fmt.Errorf("close upload: %w", err)
			}
			usedObjects := int64(1)
			usedBytes := put.Size
			if exists {
				usedObjects, usedBytes = 0, put.Size-cur.SizeBytes
			}
			if _, err := q.SettleQuota(ctx, objectsdb.SettleQuotaParams{ProjectID: b.ProjectID, UsedBytes: usedBytes,
				UsedObjects: usedObjects, ReservedBytes: up.ReservedBytes, ReservedObjects: up.ReservedObjects, Now: now}); err != nil {
				return fmt.Errorf("settle quota: %w", err)
			}
			if exists {
				if err := q.QueueBlob(ctx, objectsdb.QueueBlobParams{BlobKey: cur.BlobKey, EnqueuedAt: now}); err != nil {
					return fmt.Errorf("queue replaced blob: %w", err)
				}
			}
			meta := map[string]any{"bucket_id": b.BucketID, "path": in.Path, "size_bytes": put.Size, "etag": etag, "replaced": exists}
			if err := s.Audit.Record(ctx, tx, auditEntry(in.Actor, "storage.object.put", b, meta)); err != nil {
				return err
			}
			out = info(row)
			return nil
		}
	})
	if err != nil {
		return ObjectInfo{}, err
	}
	if replaced != "" {
		s.collect(ctx, replaced)
	}
	s.Metrics.ObjectPut()
	return out, nil
}

func auditEntry(a Actor, action string, b Bucket, meta map[string]any) audit.Entry {
	for k, v := range a.Metadata {
		meta[k] = v
	}
	return audit.Entry{Action: action, TargetType: "storage_bucket", TargetID: b.ID.String(), TenantID: b.TenantID,
		ProjectID: b.ProjectID, Metadata: meta, ActorType: a.Type}
}

func actorUser(ctx context.Context) uuid.NullUUID {
	if p, ok := principal.From(ctx); ok && p.UserID != uuid.Nil {
		return uuid.NullUUID{UUID: p.UserID, Valid: true}
	}
	return uuid.NullUUID{}
}

// lockActiveBucket holds the bucket against a concurrent forced delete until the
// transaction ends, and refuses a bucket already being deleted (as not found: it is
// going away, and no new object may land in it).
func lockActiveBucket(ctx context.Context, q *objectsdb.Queries, b Bucket) error {
	state, err := q.LockBucketState(ctx, b.ID)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && state != "active") {
		return apierr.New(apierr.StorageObjectNotFound, "bucket not found").With("resource", "bucket").With("bucket_id", b.BucketID)
	}
	if err != nil {
		return fmt.Errorf("lock bucket: %w", err)
	}
	return nil
}

// writeOutcome turns a precondition outcome of a write into its error.
func writeOutcome(o outcome, path string) error {
	switch o {
	case alreadyExists:
		return errAlreadyExists(path)
	case preconditionFailed:
		return errPreconditionFailed()
	}
	return nil
}

// discard deletes a blob no row names (a failed upload's), on a context of its own.
func (s *Store) discard(ctx context.Context, key string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.Config.StepTimeout)
	defer cancel()
	if err := s.Blob.Delete(ctx, key); err != nil {
		s.Log.Warn("storage: could not delete a failed upload's blob", "blob_key", key, "error", err)
	}
}

// collect deletes a blob queued in storage_blob_gc after the commit that unreferenced
// it, then takes it off the queue; when either fails, the queue keeps it for the sweeper.
func (s *Store) collect(ctx context.Context, key string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.Config.StepTimeout)
	defer cancel()
	if err := s.Blob.Delete(ctx, key); err != nil {
		s.Log.Warn("storage: could not delete a replaced blob (left queued)", "blob_key", key, "error", err)
		return
	}
	if err := objectsdb.New(s.Pool).UnqueueBlob(ctx, key); err != nil {
		s.Log.Warn("storage: could not unqueue a deleted blob", "blob_key", key, "error", err)
	}
}

func isNotFound(err error) bool {
	e, ok := apierr.As(err)
	return ok && e.Code == apierr.StorageObjectNotFound
}

// meteredBody is an upload's body as the blob driver reads it. It counts bytes as they
// arrive, refuses the object once it passes the per-PUT limit, and, for a body of
// unknown length, grows the quota reservation ahead of the bytes, so the quota is
// enforced as bytes arrive, never after the fact. Any error it returns makes the
// driver's Put fail and leave nothing behind.
type meteredBody struct {
	ctx      context.Context
	r        io.Reader
	size     int64 // declared length, -1 for unknown
	limit    int64 // per-PUT limit
	got      int64
	reserved int64
	step     int64
	store    *Store
	res      *reservation
	err      error // sticky: the first refusal
}

func (m *meteredBody) Read(p []byte) (int, error) {
	if m.err != nil {
		return 0, m.err
	}
	n, err := m.r.Read(p)
	m.got += int64(n)
	switch {
	case m.got > m.limit:
		m.store.Metrics.QuotaRefused()
		return 0, m.fail(errTooLarge(m.limit))
	case m.size >= 0 && m.got > m.size:
		return 0, m.fail(errBodyLength(m.size, m.got, "longer"))
	case m.got > m.reserved:
		want := min(max(m.step, m.got-m.reserved), m.limit-m.reserved)
		if gerr := m.store.grow(m.ctx, m.res, want); gerr != nil {
			return 0, m.fail(gerr)
		}
		m.reserved += want
	case n > 0:
		if rerr := m.store.refresh(m.ctx, m.res); rerr != nil {
			return 0, m.fail(rerr)
		}
	}
	switch {
	case err == nil || errors.Is(err, io.EOF):
		if errors.Is(err, io.EOF) && m.size >= 0 && m.got < m.size {
			return n, m.fail(errBodyLength(m.size, m.got, "shorter"))
		}
		return n, err
	case errors.Is(err, io.ErrUnexpectedEOF):
		// net/http: the connection ended before Content-Length bytes arrived.
		return n, m.fail(errBodyLength(m.size, m.got, "shorter"))
	default:
		return n, m.fail(errBodyRead(err))
	}
}

func (m *meteredBody) fail(err error) error {
	m.err = err
	return err
}

func errTooLarge(limit int64) error {
	return apierr.New(apierr.StorageQuotaExceeded, "the object is larger than the per-upload limit of %d bytes", limit).
		With("reason", "object_too_large").With("limit_bytes", limit).WithStatus(http.StatusRequestEntityTooLarge)
}

func errBodyLength(declared, got int64, how string) error {
	return apierr.New(apierr.InvalidRequest, "the body is %s than its Content-Length of %d bytes", how, declared).
		With("field", "Content-Length").With("reason", "body_length_mismatch").With("content_length", declared).
		With("received_bytes", got)
}

// errBodyRead: the body stopped arriving (the client disconnected or went quiet past
// the idle timeout). No one may be listening for the answer; it is still a clear one.
func errBodyRead(cause error) error {
	e := apierr.New(apierr.InvalidRequest, "the request body could not be read to its end").
		With("field", "body").With("reason", "body_incomplete")
	if errors.Is(cause, context.Canceled) || errors.Is(cause, context.DeadlineExceeded) {
		return e // the client went away: not a database that stopped answering
	}
	return e.Wrap(cause)
}
