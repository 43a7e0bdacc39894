package attach

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/attach/attachdb"
	"github.com/gantry-gpu/gantry/shared/alloctask"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Attachments named by an allocation create (`storage_attachments`). They are checked
// and authorised before the allocation exists, stored in the launch's transaction as
// attaching without a task (nothing can be mounted on a node that has no workload yet),
// and given their storage.attach task in the transaction that makes the allocation
// active; Run's sweep delivers it. An allocation that ends before it is active detaches
// them through AllocationEnded, as for any allocation.

// MaxLaunchAttachments is how many attachments one allocation create may name (the
// contract's maxItems).
const MaxLaunchAttachments = 8

// LaunchPlan is a launch's attachments, checked and authorised, ready to be recorded.
type LaunchPlan struct {
	svc     *Service
	caller  *principal.Principal
	tenant  uuid.UUID
	project uuid.UUID
	items   []planned
}

type planned struct {
	bucket Bucket
	mode   string
	rel    string
}

// indexed tags a refusal with the entry of storage_attachments it is about.
func indexed(err error, i int) error {
	if e, ok := apierr.As(err); ok {
		e.With("storage_attachments_index", i)
	}
	return err
}

// PrepareLaunch checks what an allocation create of project projectID (tenant
// tenantID) asks to attach, in the attachment API's order and with its errors: each
// entry's mode and mount path, no two at one mount path, then the access rule for the
// caller on each bucket (no access or another tenant's bucket: bucket not found; read
// access asking for rw: insufficient_permissions). Nothing is written.
func (s *Service) PrepareLaunch(ctx context.Context, caller *principal.Principal, tenantID, projectID uuid.UUID, reqs []AttachRequest) (*LaunchPlan, error) {
	if len(reqs) > MaxLaunchAttachments {
		return nil, apierr.Validation("storage_attachments", "at most %d storage attachments", MaxLaunchAttachments).With("reason", "too_many")
	}
	plan := &LaunchPlan{svc: s, caller: caller, tenant: tenantID, project: projectID}
	paths := map[string]bool{}
	for i, req := range reqs {
		if req.Mode != alloctask.StorageModeRO && req.Mode != alloctask.StorageModeRW {
			return nil, indexed(apierr.New(apierr.ValidationError, `mode must be "ro" or "rw"`).With("field", "mode"), i)
		}
		rel, err := mountPath(req.MountPath, req.BucketID)
		if err != nil {
			return nil, indexed(err, i)
		}
		if paths[rel] {
			return nil, indexed(apierr.New(apierr.StorageAlreadyExists, "two storage attachments at one mount path").
				With("field", "mount_path").With("mount_path", rel), i)
		}
		paths[rel] = true
		plan.items = append(plan.items, planned{mode: req.Mode, rel: rel})
	}
	for i, req := range reqs {
		owner := req.BucketProject
		if owner == uuid.Nil {
			owner = projectID
		}
		b, err := s.Buckets.AuthorizeBucket(ctx, caller, owner, req.BucketID, req.Mode == alloctask.StorageModeRW)
		if err != nil {
			return nil, indexed(err, i)
		}
		if b.TenantID != tenantID {
			// The access rule never hands out another tenant's bucket; this is a second lock.
			return nil, indexed(apierr.New(apierr.InvalidRequest, "bucket not found").With("reason", "not_found"), i)
		}
		plan.items[i].bucket = b
	}
	return plan, nil
}

// Empty reports whether the plan attaches nothing.
func (p *LaunchPlan) Empty() bool { return p == nil || len(p.items) == 0 }

// Record stores the plan's attachments for the new allocation allocationID inside the
// launch's transaction tx: attaching with no task, audited (storage_attachment.create)
// with their outbox events.
func (p *LaunchPlan) Record(ctx context.Context, tx pgx.Tx, allocationID uuid.UUID) error {
	if p.Empty() {
		return nil
	}
	s, q, now := p.svc, attachdb.New(tx), p.svc.now()
	for _, it := range p.items {
		row, err := q.InsertAttachment(ctx, attachdb.InsertAttachmentParams{
			ID: s.IDs.New(), AllocationID: allocationID, TenantID: p.tenant, ProjectID: p.project, Bucket: it.bucket.ID,
			BucketProject: it.bucket.ProjectID, BucketID: it.bucket.BucketID, Mode: it.mode, MountPath: it.rel,
			CreatedBy: uuid.NullUUID{UUID: p.caller.UserID, Valid: p.caller.UserID != uuid.Nil}, CreatedAt: now,
		})
		if errors.Is(err, pgx.ErrNoRows) {
			// PrepareLaunch refused duplicates and the allocation is new; kept as the API's answer.
			return apierr.New(apierr.StorageAlreadyExists, "something is already attached at this mount path of the allocation").
				With("field", "mount_path").With("mount_path", it.rel)
		}
		if err != nil {
			return fmt.Errorf("insert attachment: %w", err)
		}
		if err := s.recordChange(ctx, tx, row, "", "storage_attachment.create", audit.Entry{Metadata: map[string]any{"on_launch": true}}); err != nil {
			return err
		}
	}
	return nil
}

// AllocationActive gives every attachment still waiting on allocationID its
// storage.attach task, inside tx (the transaction that moves the allocation to active,
// holding its lock); Run's sweep delivers the tasks after the commit. Audited as
// storage_attachment.allocation_active. allocations.Service calls it on every move to
// active; only a launch's attachments are waiting, so later moves find none.
func (s *Service) AllocationActive(ctx context.Context, tx pgx.Tx, allocationID uuid.UUID) error {
	q := attachdb.New(tx)
	rows, err := q.WaitingAttachments(ctx, allocationID)
	if err != nil {
		return fmt.Errorf("waiting attachments: %w", err)
	}
	now := s.now()
	for _, r := range rows {
		row, err := q.StartAttachTask(ctx, attachdb.StartAttachTaskParams{ID: r.ID, TaskID: uuid.NullUUID{UUID: s.IDs.New(), Valid: true}, At: &now})
		if err != nil {
			return fmt.Errorf("start attach task: %w", err)
		}
		if err := s.Audit.Record(ctx, tx, audit.Entry{
			Action: "storage_attachment.allocation_active", TargetType: "storage_attachment", TargetID: row.ID.String(),
			TenantID: row.TenantID, ProjectID: row.ProjectID, ActorType: audit.ActorSystem,
			Metadata: map[string]any{"allocation_id": row.AllocationID.String(), "bucket_id": row.BucketID, "task_id": row.TaskID.UUID.String()},
		}); err != nil {
			return fmt.Errorf("audit storage_attachment.allocation_active: %w", err)
		}
	}
	return nil
}
