package storage

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/storagedb"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Grantee kinds.
const (
	GranteeProject        = "project"
	GranteeUser           = "user"
	GranteeServiceAccount = "service_account"
)

// Grant is a storage_grants row.
type Grant = storagedb.StorageGrant

// CreateGrant gives granteeKind granteeID access to the bucket (of the caller's project,
// already loaded). The grantee must exist in the bucket's tenant: anything else,
// including an id of another tenant, is 422 naming grantee_id without saying which.
func (s *Service) CreateGrant(ctx context.Context, b Bucket, granteeKind string, granteeID uuid.UUID, access Access) (Grant, error) {
	if access != Read && access != ReadWrite {
		return Grant{}, apierr.Validation("access", "access must be read or read_write")
	}
	var out Grant
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := storagedb.New(tx)
		var (
			ok  bool
			err error
		)
		switch granteeKind {
		case GranteeProject:
			if granteeID == b.ProjectID {
				return apierr.Validation("grantee_id", "the bucket's own project needs no grant").With("reason", "own_project")
			}
			ok, err = q.ProjectInTenant(ctx, storagedb.ProjectInTenantParams{ID: granteeID, TenantID: b.TenantID})
		case GranteeUser:
			ok, err = q.UserInTenant(ctx, storagedb.UserInTenantParams{ID: granteeID, TenantID: uuid.NullUUID{UUID: b.TenantID, Valid: true}})
		case GranteeServiceAccount:
			ok, err = q.ServiceAccountInTenant(ctx, storagedb.ServiceAccountInTenantParams{ID: granteeID, TenantID: b.TenantID})
		default:
			return apierr.Validation("grantee_kind", "grantee_kind must be project, user or service_account")
		}
		if err != nil {
			return fmt.Errorf("grantee lookup: %w", err)
		}
		if !ok {
			return apierr.Validation("grantee_id", "no %s with this id in your organization", granteeKind).With("reason", "unknown_grantee")
		}
		out, err = q.InsertGrant(ctx, storagedb.InsertGrantParams{ID: s.IDs.New(), Bucket: b.ID, TenantID: b.TenantID,
			GranteeKind: granteeKind, GranteeID: granteeID, Access: string(access), CreatedBy: actorID(ctx), CreatedAt: s.Clock.Now()})
		if errors.Is(err, pgx.ErrNoRows) {
			return apierr.New(apierr.StorageAlreadyExists, "this %s already has a grant on the bucket; revoke it to change its access", granteeKind).
				With("field", "grantee_id")
		}
		if err != nil {
			return fmt.Errorf("insert grant: %w", err)
		}
		if err := s.Audit.Record(ctx, tx, grantAudit("storage.grant.create", b, out)); err != nil {
			return err
		}
		return s.enqueue(ctx, tx, EventGrantCreated, grantPayload(b, out))
	})
	return out, err
}

// ListGrants is a page of the bucket's grants by id.
func (s *Service) ListGrants(ctx context.Context, b Bucket, after uuid.UUID, limit int) ([]Grant, bool, error) {
	rows, err := s.read(ctx).ListGrants(ctx, storagedb.ListGrantsParams{Bucket: b.ID, After: after, Limit: int32(limit + 1)})
	if err != nil {
		return nil, false, fmt.Errorf("list grants: %w", err)
	}
	if len(rows) > limit {
		return rows[:limit], true, nil
	}
	if rows == nil {
		rows = []Grant{}
	}
	return rows, false, nil
}

// RevokeGrant deletes a grant of the bucket. The access check reads grants on every
// request, so the grantee's next request is refused.
func (s *Service) RevokeGrant(ctx context.Context, b Bucket, grantID uuid.UUID) error {
	return db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		g, err := storagedb.New(tx).DeleteGrant(ctx, storagedb.DeleteGrantParams{ID: grantID, Bucket: b.ID})
		if errors.Is(err, pgx.ErrNoRows) {
			return apierr.New(apierr.StorageObjectNotFound, "grant not found").With("resource", "grant")
		}
		if err != nil {
			return fmt.Errorf("delete grant: %w", err)
		}
		if err := s.Audit.Record(ctx, tx, grantAudit("storage.grant.revoke", b, g)); err != nil {
			return err
		}
		return s.enqueue(ctx, tx, EventGrantRevoked, grantPayload(b, g))
	})
}

func grantAudit(action string, b Bucket, g Grant) audit.Entry {
	return audit.Entry{Action: action, TargetType: "storage_grant", TargetID: g.ID.String(), TenantID: b.TenantID, ProjectID: b.ProjectID,
		Metadata: map[string]any{"bucket_id": b.BucketID, "grantee_kind": g.GranteeKind, "grantee_id": g.GranteeID.String(), "access": g.Access}}
}

func grantPayload(b Bucket, g Grant) map[string]any {
	p := bucketPayload(b)
	p["grant_id"], p["grantee_kind"], p["grantee_id"], p["access"] = g.ID.String(), g.GranteeKind, g.GranteeID.String(), g.Access
	return p
}
