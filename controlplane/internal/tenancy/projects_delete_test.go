package tenancy_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// insertAllocation stores a live allocation of project through q, as a launch does.
func insertAllocation(ctx context.Context, q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, tenant, project uuid.UUID) error {
	id := uuid.New()
	_, err := q.Exec(ctx, `INSERT INTO allocations (id, tenant_id, project_id, owner_user_id, name, sku, gpu_model,
		gpu_count, usage_unit, region_code, node_id, ssh_key_ids, ssh_public_keys, status, created_at, updated_at)
		VALUES ($1, $2, $3, $1, 'a', 'h100.1x', 'H100', 1, 'gpu.h100', 'r1', $1, '{}', '{}', 'requested', now(), now())`,
		id, tenant, project)
	return err
}

// awaitLockWait waits until some other session waits on a lock (a deadline, not a
// timing assertion: it only bounds a test that would otherwise hang).
func (f *fixture) awaitLockWait(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for f.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no session came to wait on the lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func wantProjectGone(t *testing.T, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23503" || pgErr.ConstraintName != "allocations_project_live" {
		t.Fatalf("allocation insert into a deleted project: %v, want 23503 allocations_project_live", err)
	}
}

// No live allocation ever belongs to a deleted project, whichever of a deletion and an
// allocation insert comes first: they meet on the project row (FOR UPDATE against the
// trigger's FOR KEY SHARE), so one always sees the other's commit. The check is
// allocations' own (ProjectInUse), as the application wires it.
func TestDeletionAndAllocationInsertSerialize(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	acme := f.org("Acme", "alice")
	bob := f.user(acme, "bob")
	f.svc.ProjectInUse = (&allocations.Service{}).ProjectInUse
	project := func(name string) uuid.UUID {
		p, err := f.svc.CreateProject(ctx, bob, tenancy.NewProject{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		return p.ID
	}

	// An insert in flight when the deletion starts: the deletion waits for it, then
	// counts it and refuses.
	p1 := project("First")
	pc1 := f.access(bob, p1)
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := insertAllocation(ctx, tx, acme.Tenant.ID, p1); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.svc.DeleteProject(ctx, pc1) }()
	f.awaitLockWait(t)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e := wantCode(t, <-done, apierr.InvalidRequest, 409)
	wantDetail(t, e, "reason", "project_in_use")

	// A deletion in flight when the insert comes: the insert waits for it, then finds
	// the project deleted.
	p2 := project("Second")
	tx, err = f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT id FROM projects WHERE id = $1 FOR UPDATE`, p2); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE projects SET deleted_at = now() WHERE id = $1`, p2); err != nil {
		t.Fatal(err)
	}
	go func() { done <- insertAllocation(ctx, f.pool, acme.Tenant.ID, p2) }()
	f.awaitLockWait(t)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wantProjectGone(t, <-done)

	// And plainly: a deleted project takes no allocation; a live one does.
	p3 := project("Third")
	if err := f.svc.DeleteProject(ctx, f.access(bob, p3)); err != nil {
		t.Fatal(err)
	}
	wantProjectGone(t, insertAllocation(ctx, f.pool, acme.Tenant.ID, p3))
	if err := insertAllocation(ctx, f.pool, acme.Tenant.ID, acme.Project.ID); err != nil {
		t.Fatalf("allocation in a live project: %v", err)
	}
	if n := f.count(`SELECT count(*) FROM allocations a JOIN projects p ON p.id = a.project_id WHERE p.deleted_at IS NOT NULL`); n != 0 {
		t.Fatalf("%d allocations in deleted projects", n)
	}
}
