package allocations

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/allocationsdb"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// ProjectInUse is tenancy's ProjectInUse: a project with a live allocation (any status
// but released, failed and completed) cannot be deleted — it would run on, and be
// billed, in a project nobody can reach. It reads inside tx, the deletion's transaction,
// which holds the project row FOR UPDATE: an allocation insert in flight holds that row
// FOR KEY SHARE (trigger allocations_project_live), so it has committed before this count
// runs, and one that comes later finds the project deleted (migration 00530).
func (s *Service) ProjectInUse(ctx context.Context, tx pgx.Tx, projectID uuid.UUID) (bool, error) {
	n, err := allocationsdb.New(tx).CountLiveInProject(ctx, projectID)
	if err != nil {
		return false, fmt.Errorf("count live allocations: %w", err)
	}
	return n > 0, nil
}

// projectDeleted reports the refusal of trigger allocations_project_live (SQLSTATE 23503,
// foreign_key_violation): the project was deleted after the request's project check and
// before this insert.
func projectDeleted(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23503" && pgErr.ConstraintName == "allocations_project_live"
}

// projectGone is the answer to a launch into a project deleted under it: the one the
// project check gives for a project that does not exist (tenancy.Access).
func projectGone() error {
	return apierr.Forbidden("you do not have access to this project")
}
