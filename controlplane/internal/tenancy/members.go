package tenancy

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy/tenancydb"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Member is a project membership; its id is the member's user id.
type Member = tenancydb.GetMemberRow

func memberNotFound() *apierr.Error { return apierr.New(apierr.UserNotFound, "member not found") }

// ListMembers is a page of the members of the request's project, by user id.
func (s *Service) ListMembers(ctx context.Context, pc projectctx.Project, after uuid.UUID, limit int) (Page[Member], error) {
	if err := Require(pc, ActRead); err != nil {
		return Page[Member]{}, err
	}
	rows, err := s.read(ctx).ListMembers(ctx, tenancydb.ListMembersParams{ProjectID: pc.ID, After: afterID(after), Limit: int32(limit + 1)})
	if err != nil {
		return Page[Member]{}, fmt.Errorf("list members: %w", err)
	}
	out := make([]Member, len(rows))
	for i, r := range rows {
		out[i] = Member(r)
	}
	return pageOf(out, limit), nil
}

// AddMember adds a user of the project's tenant with role. A user outside the tenant is
// user_not_found; an existing member is user_already_exists.
func (s *Service) AddMember(ctx context.Context, pc projectctx.Project, userID uuid.UUID, role string) (Member, error) {
	if err := requireMemberChange(pc, "", role); err != nil {
		return Member{}, err
	}
	var out Member
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := tenancydb.New(tx)
		if err := lockProject(ctx, q, pc.ID); err != nil {
			return err
		}
		if _, err := q.GetTenantUser(ctx, tenancydb.GetTenantUserParams{ID: userID, TenantID: uuid.NullUUID{UUID: pc.TenantID, Valid: true}}); isNoRows(err) {
			return apierr.NotFound(apierr.UserNotFound, "user").With("field", "user_id")
		} else if err != nil {
			return fmt.Errorf("load user: %w", err)
		}
		n, err := q.InsertMember(ctx, tenancydb.InsertMemberParams{ProjectID: pc.ID, UserID: userID, Role: role, CreatedAt: s.Clock.Now()})
		if err != nil {
			return fmt.Errorf("insert member: %w", err)
		}
		if n == 0 {
			return apierr.New(apierr.UserAlreadyExists, "the user is already a member of this project").With("field", "user_id")
		}
		if out, err = q.GetMember(ctx, tenancydb.GetMemberParams{ProjectID: pc.ID, UserID: userID}); err != nil {
			return fmt.Errorf("load member: %w", err)
		}
		return s.Audit.Record(ctx, tx, audit.Entry{
			Action: "project.member.add", TargetType: "user", TargetID: userID.String(), TenantID: pc.TenantID, ProjectID: pc.ID,
			Metadata: map[string]any{"role": role},
		})
	})
	return out, err
}

// UpdateMember changes a member's role. Moves that touch the owner role need an owner;
// the last owner cannot be demoted. Setting the role a member already has changes
// nothing and audits nothing.
func (s *Service) UpdateMember(ctx context.Context, pc projectctx.Project, userID uuid.UUID, role string) (Member, error) {
	if err := Require(pc, ActManageMembers); err != nil {
		return Member{}, err
	}
	var out Member
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := tenancydb.New(tx)
		cur, err := s.lockedMember(ctx, q, pc.ID, userID)
		if err != nil {
			return err
		}
		if cur.Role == role {
			out = cur
			return nil
		}
		if err := requireMemberChange(pc, cur.Role, role); err != nil {
			return err
		}
		if err := s.keepAnOwner(ctx, q, pc.ID, cur.Role); err != nil {
			return err
		}
		if err := q.UpdateMemberRole(ctx, tenancydb.UpdateMemberRoleParams{ProjectID: pc.ID, UserID: userID, Role: role, UpdatedAt: s.Clock.Now()}); err != nil {
			return fmt.Errorf("update member: %w", err)
		}
		if out, err = q.GetMember(ctx, tenancydb.GetMemberParams{ProjectID: pc.ID, UserID: userID}); err != nil {
			return fmt.Errorf("load member: %w", err)
		}
		return s.Audit.Record(ctx, tx, audit.Entry{
			Action: "project.member.update", TargetType: "user", TargetID: userID.String(), TenantID: pc.TenantID, ProjectID: pc.ID,
			Metadata: map[string]any{"from": cur.Role, "to": role},
		})
	})
	return out, err
}

// RemoveMember removes a member. Removing an owner needs an owner; the last owner stays.
func (s *Service) RemoveMember(ctx context.Context, pc projectctx.Project, userID uuid.UUID) error {
	if err := Require(pc, ActManageMembers); err != nil {
		return err
	}
	return db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := tenancydb.New(tx)
		cur, err := s.lockedMember(ctx, q, pc.ID, userID)
		if err != nil {
			return err
		}
		if err := requireMemberChange(pc, cur.Role, ""); err != nil {
			return err
		}
		if err := s.keepAnOwner(ctx, q, pc.ID, cur.Role); err != nil {
			return err
		}
		if err := q.DeleteMember(ctx, tenancydb.DeleteMemberParams{ProjectID: pc.ID, UserID: userID}); err != nil {
			return fmt.Errorf("delete member: %w", err)
		}
		return s.Audit.Record(ctx, tx, audit.Entry{
			Action: "project.member.remove", TargetType: "user", TargetID: userID.String(), TenantID: pc.TenantID, ProjectID: pc.ID,
			Metadata: map[string]any{"role": cur.Role},
		})
	})
}

// lockedMember locks the project (serialising membership changes, so the owner count
// read below stays true until commit) and loads the member.
func (s *Service) lockedMember(ctx context.Context, q *tenancydb.Queries, projectID, userID uuid.UUID) (Member, error) {
	if err := lockProject(ctx, q, projectID); err != nil {
		return Member{}, err
	}
	m, err := q.GetMember(ctx, tenancydb.GetMemberParams{ProjectID: projectID, UserID: userID})
	if isNoRows(err) {
		return m, memberNotFound()
	}
	if err != nil {
		return m, fmt.Errorf("load member: %w", err)
	}
	return m, nil
}

// keepAnOwner refuses taking the owner role from the project's last owner.
func (s *Service) keepAnOwner(ctx context.Context, q *tenancydb.Queries, projectID uuid.UUID, fromRole string) error {
	if fromRole != projectctx.RoleOwner {
		return nil
	}
	n, err := q.CountOwners(ctx, projectID)
	if err != nil {
		return fmt.Errorf("count owners: %w", err)
	}
	if n <= 1 {
		return conflict("last_owner", "a project must keep at least one owner")
	}
	return nil
}
