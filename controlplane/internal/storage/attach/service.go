package attach

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/attach/attachdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/objpath"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/alloctask"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// Attachment is a storage_attachments row.
type Attachment = attachdb.StorageAttachment

// Bucket is what an attachment needs to know of an authorised bucket.
type Bucket struct {
	ID        uuid.UUID // the row's uuid
	TenantID  uuid.UUID
	ProjectID uuid.UUID // the owner project
	BucketID  string    // the user-chosen id
}

// BucketAccess is the storage access rule (storage.Service.Authorize behind an adapter):
// whether caller may read (write false) or write the bucket bucketID of the owner
// project. Its refusals are the contract's (bucket not found for no access or another
// tenant, insufficient_permissions for a read-only caller asking to write).
type BucketAccess interface {
	AuthorizeBucket(ctx context.Context, caller *principal.Principal, ownerProject uuid.UUID, bucketID string, write bool) (Bucket, error)
}

// Dispatcher delivers a task to a node's agent wherever its tunnel is (implemented by
// *fabric.Server).
type Dispatcher interface {
	Dispatch(ctx context.Context, nodeID uuid.UUID, task *fabricv1.TaskDispatch) (*fabricv1.TaskAck, error)
}

// Defaults of Config.
const (
	DefaultTaskTimeout   = 10 * time.Minute
	DefaultRetryInterval = 5 * time.Second
	DefaultSweepInterval = 5 * time.Second
)

// Config tunes attachments.
type Config struct {
	// TaskTimeout: a task the node did not acknowledge, or acknowledged and never reported
	// on, within it fails (attach → failed; detach → attached with the error).
	TaskTimeout time.Duration
	// RetryInterval is how long an unacknowledged task waits before it is sent again.
	RetryInterval time.Duration
	// SweepInterval is how often Run redelivers, times out and catches up.
	SweepInterval time.Duration
}

func (c Config) withDefaults() Config {
	if c.TaskTimeout <= 0 {
		c.TaskTimeout = DefaultTaskTimeout
	}
	if c.RetryInterval <= 0 {
		c.RetryInterval = DefaultRetryInterval
	}
	if c.SweepInterval <= 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	return c
}

// Service is storage attachments over PostgreSQL.
type Service struct {
	Pool    *pgxpool.Pool
	Clock   clock.Clock
	IDs     ids.Source
	Audit   *audit.Log
	Outbox  *outbox.Writer
	Buckets BucketAccess
	// Fabric delivers tasks; nil leaves them to a replica that has one (Run's sweep).
	Fabric Dispatcher
	Config Config
	Log    *slog.Logger

	inflight sync.WaitGroup // deliveries sendSoon started
}

// New returns the service; fab may be nil (see Service.Fabric).
func New(pool *pgxpool.Pool, clk clock.Clock, idSrc ids.Source, buckets BucketAccess, fab Dispatcher, cfg Config, log *slog.Logger) *Service {
	if clk == nil {
		clk = clock.Real{}
	}
	if idSrc == nil {
		idSrc = ids.V7{}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{
		Pool: pool, Clock: clk, IDs: idSrc, Audit: &audit.Log{Clock: clk, IDs: idSrc}, Outbox: &outbox.Writer{Clock: clk, IDs: idSrc},
		Buckets: buckets, Fabric: fab, Config: cfg.withDefaults(), Log: log.With("component", "storage_attach"),
	}
}

func (s *Service) now() time.Time { return s.Clock.Now().UTC() }

// AttachRequest is what a caller asks to attach.
type AttachRequest struct {
	BucketID string
	// BucketProject is the bucket's owner project; uuid.Nil means the allocation's.
	BucketProject uuid.UUID
	Mode          string
	// MountPath is relative to the runtime user's home; "" means buckets/<bucket_id>.
	MountPath string
}

// Allocation statuses in which a workload runs and a bucket may be attached.
var attachable = map[string]bool{"active": true, "idle": true}

// Allocation statuses after which the node holds nothing of the allocation.
var ended = map[string]bool{"released": true, "failed": true, "completed": true}

func allocationNotFound() error {
	return apierr.New(apierr.AllocationNotFound, "allocation not found")
}

func attachmentNotFound() error {
	e := apierr.New(apierr.InvalidRequest, "storage attachment not found").With("reason", "not_found")
	e.Status = 404
	return e
}

// mountPath checks and completes the requested mount path: relative to the home, in
// the object-path rules (a traversal is storage_path_traversal, anything else not
// canonical a validation_error), the default when empty.
func mountPath(raw, bucketID string) (string, error) {
	if raw == "" {
		rel := alloctask.DefaultMountPath(bucketID)
		if !alloctask.ValidMountPath(rel) {
			// A bucket id such as "a/../b" matches the bucket pattern but cannot be a path.
			return "", apierr.New(apierr.ValidationError, "this bucket id cannot be a mount path; give mount_path").
				With("field", "mount_path").With("reason", "default_path_invalid")
		}
		return rel, nil
	}
	rel, err := objpath.Clean(raw)
	if err != nil {
		return "", pathError(err, "mount_path")
	}
	if rel != raw || !alloctask.ValidMountPath(rel) {
		return "", apierr.New(apierr.ValidationError, "mount_path must be a canonical path relative to the home directory").
			With("field", "mount_path").With("reason", "not_canonical")
	}
	return rel, nil
}

// pathError is the contract's refusal of a path objpath refused: a traversal is
// storage_path_traversal (400), anything else (empty, too long) validation_error.
func pathError(err error, field string) error {
	if errors.Is(err, objpath.ErrTraversal) {
		return apierr.New(apierr.StoragePathTraversal, "the path escapes its root").With("field", field)
	}
	return apierr.New(apierr.ValidationError, "%s", err.Error()).With("field", field)
}

// Attach attaches a bucket into an active allocation of project projectID (the request's
// project context): the checks in the order docs/storage.md gives, then one
// transaction under the allocation's lock (row in attaching with its storage.attach
// task, audit, outbox event). The task is sent after the commit.
func (s *Service) Attach(ctx context.Context, caller *principal.Principal, projectID, allocationID uuid.UUID, req AttachRequest) (Attachment, error) {
	// 1. The allocation, in the caller's project (another project's is not found).
	a, err := attachdb.New(db.Querier(ctx, s.Pool)).GetAllocation(ctx, allocationID)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && a.ProjectID != projectID) {
		return Attachment{}, allocationNotFound()
	}
	if err != nil {
		return Attachment{}, fmt.Errorf("load allocation: %w", err)
	}
	// 2. The request itself.
	if req.Mode != alloctask.StorageModeRO && req.Mode != alloctask.StorageModeRW {
		return Attachment{}, apierr.New(apierr.ValidationError, `mode must be "ro" or "rw"`).With("field", "mode")
	}
	rel, err := mountPath(req.MountPath, req.BucketID)
	if err != nil {
		return Attachment{}, err
	}
	// 3. The allocation runs a workload.
	if !attachable[a.Status] {
		return Attachment{}, apierr.New(apierr.AllocationNotActive, "a bucket can be attached only to an active allocation").With("status", a.Status)
	}
	// 4. The bucket: read access for ro, write access for rw, decided by the access rule
	// for the caller (a member of the allocation's project, so a grant to that project
	// counts).
	owner := req.BucketProject
	if owner == uuid.Nil {
		owner = a.ProjectID
	}
	b, err := s.Buckets.AuthorizeBucket(ctx, caller, owner, req.BucketID, req.Mode == alloctask.StorageModeRW)
	if err != nil {
		return Attachment{}, err
	}
	if b.TenantID != a.TenantID {
		// The access rule never hands out another tenant's bucket; this is a second lock.
		return Attachment{}, apierr.New(apierr.InvalidRequest, "bucket not found").With("reason", "not_found")
	}

	var out Attachment
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := attachdb.New(tx)
		locked, err := q.LockAllocation(ctx, allocationID)
		if err != nil {
			return fmt.Errorf("lock allocation: %w", err)
		}
		if !attachable[locked.Status] {
			return apierr.New(apierr.AllocationNotActive, "a bucket can be attached only to an active allocation").With("status", locked.Status)
		}
		now := s.now()
		out, err = q.InsertAttachment(ctx, attachdb.InsertAttachmentParams{
			ID: s.IDs.New(), AllocationID: a.ID, TenantID: a.TenantID, ProjectID: a.ProjectID, Bucket: b.ID,
			BucketProject: b.ProjectID, BucketID: b.BucketID, Mode: req.Mode, MountPath: rel,
			CreatedBy: uuid.NullUUID{UUID: caller.UserID, Valid: caller.UserID != uuid.Nil}, CreatedAt: now,
			TaskID: uuid.NullUUID{UUID: s.IDs.New(), Valid: true},
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return apierr.New(apierr.StorageAlreadyExists, "something is already attached at this mount path of the allocation").
				With("field", "mount_path").With("mount_path", rel)
		}
		if err != nil {
			return fmt.Errorf("insert attachment: %w", err)
		}
		return s.recordChange(ctx, tx, out, "", "storage_attachment.create", audit.Entry{})
	})
	if err != nil {
		return Attachment{}, err
	}
	s.sendSoon(ctx, out)
	return out, nil
}

// List is one page of an allocation's attachments (the allocation in projectID).
func (s *Service) List(ctx context.Context, projectID, allocationID, after uuid.UUID, limit int) ([]Attachment, bool, error) {
	q := attachdb.New(db.Querier(ctx, s.Pool))
	a, err := q.GetAllocation(ctx, allocationID)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && a.ProjectID != projectID) {
		return nil, false, allocationNotFound()
	}
	if err != nil {
		return nil, false, fmt.Errorf("load allocation: %w", err)
	}
	rows, err := q.ListAttachments(ctx, attachdb.ListAttachmentsParams{AllocationID: allocationID, After: after, MaxRows: int32(limit + 1)})
	if err != nil {
		return nil, false, fmt.Errorf("list attachments: %w", err)
	}
	more := len(rows) > limit
	if more {
		rows = rows[:limit]
	}
	return rows, more, nil
}

// Get is one attachment of an allocation of projectID.
func (s *Service) Get(ctx context.Context, projectID, allocationID, attachmentID uuid.UUID) (Attachment, error) {
	q := attachdb.New(db.Querier(ctx, s.Pool))
	a, err := q.GetAllocation(ctx, allocationID)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && a.ProjectID != projectID) {
		return Attachment{}, allocationNotFound()
	}
	if err != nil {
		return Attachment{}, fmt.Errorf("load allocation: %w", err)
	}
	row, err := q.GetAttachment(ctx, attachdb.GetAttachmentParams{ID: attachmentID, AllocationID: allocationID})
	if errors.Is(err, pgx.ErrNoRows) {
		return Attachment{}, attachmentNotFound()
	}
	if err != nil {
		return Attachment{}, fmt.Errorf("load attachment: %w", err)
	}
	return row, nil
}

// Detach asks the node to detach (attaching/attached → detaching, with a storage.detach
// task); a failed attachment becomes detached at once (nothing is mounted), a
// detaching or detached one is answered as it is (a repeat writes nothing).
func (s *Service) Detach(ctx context.Context, projectID, allocationID, attachmentID uuid.UUID) (Attachment, error) {
	if _, err := s.Get(ctx, projectID, allocationID, attachmentID); err != nil {
		return Attachment{}, err
	}
	var out Attachment
	var changed bool
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := attachdb.New(tx)
		if _, err := q.LockAllocation(ctx, allocationID); err != nil {
			return fmt.Errorf("lock allocation: %w", err)
		}
		cur, err := q.LockAttachment(ctx, attachmentID)
		if err != nil {
			return fmt.Errorf("lock attachment: %w", err)
		}
		out, changed, err = s.apply(ctx, tx, cur, Detach, change{}, "storage_attachment.delete")
		return err
	})
	if err != nil {
		return Attachment{}, err
	}
	if changed {
		s.sendSoon(ctx, out)
	}
	return out, nil
}

// change is what a transition writes besides the state.
type change struct {
	method, hostPath, err string
	actorType             string // audit actor override (node, system)
	metadata              map[string]any
}

// apply moves the locked attachment cur by e: the state table decides; a change writes
// the new state with the task it wants, the audit row (action) and the outbox event
// storage.attachment.<state>. A refused move is storage conflict (409) for a user's
// DELETE and ErrRefused otherwise.
func (s *Service) apply(ctx context.Context, tx pgx.Tx, cur Attachment, e Event, c change, action string) (Attachment, bool, error) {
	out, err := Apply(State(cur.State), e)
	if err != nil {
		return cur, false, err
	}
	if !out.Changed {
		return cur, false, nil
	}
	p := attachdb.SetStateParams{ID: cur.ID, State: string(out.To), At: s.now()}
	if kind := out.To.Task(); kind != "" {
		p.TaskID, p.TaskKind = uuid.NullUUID{UUID: s.IDs.New(), Valid: true}, &kind
	}
	if c.method != "" {
		p.Method = &c.method
	}
	if c.hostPath != "" {
		p.HostPath = &c.hostPath
	}
	if c.err != "" {
		p.Error = &c.err
	}
	row, err := attachdb.New(tx).SetState(ctx, p)
	if err != nil {
		return cur, false, fmt.Errorf("set attachment state: %w", err)
	}
	return row, true, s.recordChange(ctx, tx, row, cur.State, action, audit.Entry{ActorType: c.actorType, Metadata: c.metadata})
}

// recordChange writes the audit row and the outbox event of a's new state (from "" on
// creation).
func (s *Service) recordChange(ctx context.Context, tx pgx.Tx, a Attachment, from, action string, extra audit.Entry) error {
	meta := map[string]any{
		"allocation_id": a.AllocationID.String(), "bucket_id": a.BucketID, "bucket_project_id": a.BucketProject.String(),
		"mode": a.Mode, "mount_path": a.MountPath, "state": a.State,
	}
	if from != "" {
		meta["from_state"] = from
	}
	if a.Method != nil {
		meta["method"] = *a.Method
	}
	if a.Error != nil {
		meta["error"] = *a.Error
	}
	for k, v := range extra.Metadata {
		meta[k] = v
	}
	if err := s.Audit.Record(ctx, tx, audit.Entry{
		Action: action, TargetType: "storage_attachment", TargetID: a.ID.String(), TenantID: a.TenantID,
		ProjectID: a.ProjectID, Metadata: meta, ActorType: extra.ActorType,
	}); err != nil {
		return fmt.Errorf("audit %s: %w", action, err)
	}
	typ := "storage.attachment." + a.State
	payload := map[string]any{"attachment_id": a.ID.String(), "tenant_id": a.TenantID.String(), "project_id": a.ProjectID.String()}
	for k, v := range meta {
		payload[k] = v
	}
	if _, err := s.Outbox.Enqueue(ctx, tx, outbox.Event{Type: typ, Subject: "gantry.events." + typ, Payload: payload}); err != nil {
		return fmt.Errorf("enqueue %s: %w", typ, err)
	}
	return nil
}

// AllocationEnded detaches every live attachment of an allocation that reached
// released, failed or completed, inside tx (which holds the allocation's lock): the
// node detached them when it released the workload, or holds nothing of it any more.
// allocations.Service calls it from the transaction of that move.
func (s *Service) AllocationEnded(ctx context.Context, tx pgx.Tx, allocationID uuid.UUID) error {
	rows, err := attachdb.New(tx).LiveAttachmentsOfAllocation(ctx, allocationID)
	if err != nil {
		return fmt.Errorf("live attachments: %w", err)
	}
	for _, r := range rows {
		if _, _, err := s.apply(ctx, tx, r, AllocationEnded, change{actorType: audit.ActorSystem}, "storage_attachment.detach_on_release"); err != nil {
			return err
		}
	}
	return nil
}
