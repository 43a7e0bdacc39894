package readmodels

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
)

// parseAttentionKey splits "<workload id>.<condition>.<unix millis>".
func parseAttentionKey(key string) (allocation uuid.UUID, condition string, sinceMs int64, ok bool) {
	i := strings.LastIndexByte(key, '.')
	if i < 0 {
		return uuid.Nil, "", 0, false
	}
	ms, err := strconv.ParseInt(key[i+1:], 10, 64)
	if err != nil {
		return uuid.Nil, "", 0, false
	}
	j := strings.LastIndexByte(key[:i], '.')
	if j < 0 {
		return uuid.Nil, "", 0, false
	}
	condition = key[j+1 : i]
	if _, isCond := DefaultWindows.window(condition); !isCond {
		return uuid.Nil, "", 0, false
	}
	id, ok := parseWorkloadID(key[:j])
	return id, condition, ms, ok
}

// Dismiss hides the attention item key from the caller's live surfaces and returns when
// the caller first dismissed it. The item must exist now (the workload is in the
// condition the key names, since the time it names) in a project the caller can see;
// anything else, another project's workload included, is not found. A repeat answers
// the first dismissal and writes nothing.
func (s *Service) Dismiss(ctx context.Context, p *principal.Principal, key string) (time.Time, error) {
	id, condition, sinceMs, ok := parseAttentionKey(key)
	if !ok {
		return time.Time{}, errWorkloadNotFound()
	}
	var tenantID, projectID uuid.UUID
	var status string
	var since time.Time
	err := db.Querier(ctx, s.Pool).QueryRow(ctx, `SELECT tenant_id, project_id, status, updated_at FROM allocations WHERE id = $1`, id).
		Scan(&tenantID, &projectID, &status, &since)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, errWorkloadNotFound()
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("attention subject: %w", err)
	}
	if _, err := s.Tenancy.Access(ctx, p, projectID); err != nil {
		return time.Time{}, errWorkloadNotFound() // never reveal another project's workload
	}
	if status != condition || since.UnixMilli() != sinceMs {
		return time.Time{}, errWorkloadNotFound()
	}
	now := s.Clock.Now().UTC()
	var at time.Time
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `
INSERT INTO v3_attention_dismissals (user_id, attention_key, allocation_id, condition, condition_since, dismissed_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (user_id, attention_key) DO NOTHING
RETURNING dismissed_at`, p.UserID, key, id, condition, since, now).Scan(&at)
		if errors.Is(err, pgx.ErrNoRows) {
			return tx.QueryRow(ctx, `SELECT dismissed_at FROM v3_attention_dismissals WHERE user_id = $1 AND attention_key = $2`,
				p.UserID, key).Scan(&at)
		}
		if err != nil {
			return err
		}
		return s.Audit.Record(ctx, tx, audit.Entry{Action: "v3.attention.dismiss", TargetType: "attention", TargetID: key,
			TenantID: tenantID, ProjectID: projectID, Metadata: map[string]any{"workload_id": AllocationWorkloadID(id), "condition": condition}})
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("dismiss: %w", err)
	}
	s.forget(ctx, p.UserID)
	return at.UTC(), nil
}

// forget drops the caller's cached shell contexts after a change of their attention.
func (s *Service) forget(ctx context.Context, user uuid.UUID) {
	if s.Cache == nil {
		return
	}
	if err := s.Cache.Forget(ctx, user); err != nil {
		s.log().Warn("shell context cache forget failed; entries age out", "error", err)
	}
}

// MarkRead moves the caller's read marker to through (nil: now; later than now: now),
// never backwards, and returns the marker in force and the unread count of the shell
// without a project (the tenant's default project, when the caller can see it).
func (s *Service) MarkRead(ctx context.Context, p *principal.Principal, through *time.Time) (time.Time, int, error) {
	now := s.Clock.Now().UTC()
	t := now
	if through != nil && through.Before(now) {
		t = through.UTC()
	}
	var at time.Time
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `
INSERT INTO notification_read_markers (user_id, read_through, updated_at) VALUES ($1, $2, $3)
ON CONFLICT (user_id) DO UPDATE SET read_through = greatest(notification_read_markers.read_through, EXCLUDED.read_through),
    updated_at = EXCLUDED.updated_at
RETURNING read_through`, p.UserID, t, now).Scan(&at); err != nil {
			return err
		}
		return s.Audit.Record(ctx, tx, audit.Entry{Action: "notifications.read_marker.update", TargetType: "user",
			TargetID: p.UserID.String(), TenantID: p.TenantID, Metadata: map[string]any{"read_through": at.UTC().Format(time.RFC3339Nano)}})
	})
	if err != nil {
		return time.Time{}, 0, fmt.Errorf("read marker: %w", err)
	}
	s.forget(ctx, p.UserID)
	project := uuid.Nil
	me, err := s.Tenancy.Me(ctx, p)
	if err != nil {
		return time.Time{}, 0, err
	}
	if me.ProjectID != uuid.Nil {
		if _, err := s.Tenancy.Access(ctx, p, me.ProjectID); err == nil {
			project = me.ProjectID
		}
	}
	att, err := s.Attention(ctx, p.UserID, me.OrgID, project, now)
	if err != nil {
		return time.Time{}, 0, err
	}
	return at.UTC(), att.UnreadNotifications, nil
}
