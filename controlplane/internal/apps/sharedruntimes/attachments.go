package sharedruntimes

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Attachment attaches a project to a runtime: its members may call the runtime through
// the app proxy, and the project pays per call.
type Attachment struct {
	ID        uuid.UUID
	RuntimeID uuid.UUID
	TenantID  uuid.UUID
	ProjectID uuid.UUID
	CreatedBy uuid.UUID
	CreatedAt time.Time
}

const attachmentColumns = `id, shared_runtime_id, tenant_id, project_id, created_by, created_at`

func scanAttachment(row pgx.Row) (Attachment, error) {
	var a Attachment
	err := row.Scan(&a.ID, &a.RuntimeID, &a.TenantID, &a.ProjectID, &a.CreatedBy, &a.CreatedAt)
	return a, err
}

// Attach attaches proj to a runtime it may see, audited shared_runtime.attach.
func (s *Service) Attach(ctx context.Context, proj projectctx.Project, actor, runtimeID uuid.UUID) (Attachment, error) {
	r, err := s.Get(ctx, proj, runtimeID)
	if err != nil {
		return Attachment{}, err
	}
	a := Attachment{ID: s.IDs.New(), RuntimeID: r.ID, TenantID: proj.TenantID, ProjectID: proj.ID, CreatedBy: actor, CreatedAt: s.Clock.Now()}
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO shared_runtime_attachments (`+attachmentColumns+`) VALUES ($1, $2, $3, $4, $5, $6)`,
			a.ID, a.RuntimeID, a.TenantID, a.ProjectID, a.CreatedBy, a.CreatedAt)
		if db.IsUniqueViolation(err, "shared_runtime_attachments_project_key") {
			return apierr.New(apierr.InvalidRequest, "the project is already attached").With("reason", "already_attached").WithStatus(409)
		}
		if err != nil {
			return fmt.Errorf("attach: %w", err)
		}
		return s.Audit.Record(ctx, tx, audit.Entry{Action: "shared_runtime.attach", TargetType: "shared_runtime", TargetID: r.ID.String(),
			TenantID: proj.TenantID, ProjectID: proj.ID, Metadata: map[string]any{"attachment_id": a.ID.String()}})
	})
	if err != nil {
		return Attachment{}, err
	}
	return a, nil
}

// Detach removes an attachment: the attached project's admins or the owner project's.
func (s *Service) Detach(ctx context.Context, proj projectctx.Project, runtimeID, attachmentID uuid.UUID) error {
	r, err := s.Get(ctx, proj, runtimeID)
	if err != nil {
		return err
	}
	return db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		a, err := scanAttachment(tx.QueryRow(ctx, `SELECT `+attachmentColumns+` FROM shared_runtime_attachments
			WHERE id = $1 AND shared_runtime_id = $2 FOR UPDATE`, attachmentID, r.ID))
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && a.ProjectID != proj.ID && r.OwnerProjectID != proj.ID) {
			return apierr.NotFound(apierr.AppNotFound, "attachment").With("reason", "attachment_not_found")
		}
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM shared_runtime_attachments WHERE id = $1`, a.ID); err != nil {
			return err
		}
		return s.Audit.Record(ctx, tx, audit.Entry{Action: "shared_runtime.detach", TargetType: "shared_runtime", TargetID: r.ID.String(),
			TenantID: a.TenantID, ProjectID: a.ProjectID, Metadata: map[string]any{"attachment_id": a.ID.String(), "by_project_id": proj.ID.String()}})
	})
}

// ListAttachments: the owner project sees every attachment, another project its own.
func (s *Service) ListAttachments(ctx context.Context, proj projectctx.Project, runtimeID, after uuid.UUID, limit int) ([]Attachment, bool, error) {
	r, err := s.Get(ctx, proj, runtimeID)
	if err != nil {
		return nil, false, err
	}
	rows, err := db.Querier(ctx, s.Pool).Query(ctx, `SELECT `+attachmentColumns+` FROM shared_runtime_attachments
		WHERE shared_runtime_id = $1 AND ($2 OR project_id = $3) AND id > $4 ORDER BY id LIMIT $5`,
		r.ID, r.OwnerProjectID == proj.ID, proj.ID, after, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("list attachments: %w", err)
	}
	defer rows.Close()
	var out []Attachment
	for rows.Next() {
		a, err := scanAttachment(rows)
		if err != nil {
			return nil, false, err
		}
		out = append(out, a)
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
