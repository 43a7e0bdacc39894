package allocations_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/proto/api"
)

// history is what a project's past consists of: its allocations and their events, its
// usage records and rated lines, the ledger, and its audit rows.
func (w *world) history(t *testing.T, project uuid.UUID) map[string]int {
	t.Helper()
	return map[string]int{
		"allocations":       w.count(t, `SELECT count(*) FROM allocations WHERE project_id = $1`, project),
		"allocation_events": w.count(t, `SELECT count(*) FROM allocation_events e JOIN allocations a ON a.id = e.allocation_id WHERE a.project_id = $1`, project),
		"usage_records":     w.count(t, `SELECT count(*) FROM billing_usage_records WHERE project_id = $1`, project),
		"rated_lines":       w.count(t, `SELECT count(*) FROM billing_rated_usage_lines l JOIN billing_usage_records r ON r.id = l.usage_record_id WHERE r.project_id = $1`, project),
		"ledger_entries":    w.count(t, `SELECT count(*) FROM billing_ledger_entries`),
		"audit_rows":        w.count(t, `SELECT count(*) FROM audit_events WHERE project_id = $1`, project),
	}
}

// stats is the project count of GET /api/v1/internal/stats.
func (w *world) stats(t *testing.T) int {
	t.Helper()
	r, err := w.Root.GetInternalStatsWithResponse(context.Background(), &api.GetInternalStatsParams{})
	if err != nil || r.StatusCode() != 200 {
		t.Fatalf("stats: %v %s", err, r.Body)
	}
	return int(r.JSON200.Projects)
}

func sameHistory(t *testing.T, when string, got, want map[string]int) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("%s: %s %d, want %d (history %v)", when, k, got[k], v, got)
		}
	}
}

// Deleting a project that had an allocation (issue 18 item 12; it answered 500 on the
// foreign key from billing usage records): refused with 409 while the allocation is live
// (releasing included), and once it is released a soft delete that keeps the whole
// history — after which the project is gone for every reader and its slug is free.
func TestDeleteProjectWithHistory(t *testing.T) {
	w, clk := clockWorld(t, 16)
	ctx := context.Background()
	node := w.node(t, "n", 2)
	cp, err := w.Alice.CreateProjectWithResponse(ctx, &api.CreateProjectParams{}, api.CreateProjectJSONRequestBody{Name: "Scratch", Slug: ptr("scratch")})
	if err != nil || cp.StatusCode() != 201 {
		t.Fatalf("create project: %v %s", err, cp.Body)
	}
	proj := cp.JSON201.Project.ID
	r, err := w.create(w.Alice, proj, "", api.CreateAllocationJSONRequestBody{Name: "train", Sku: sku1x})
	if err != nil || r.StatusCode() != 201 {
		t.Fatalf("create allocation: %v %s", err, r.Body)
	}
	a := *r.JSON201
	w.activate(t, node, a.ID)
	clk.Advance(time.Hour)
	if _, err := w.App.Billing.RateRunning(ctx, clk.Now(), 500); err != nil {
		t.Fatal(err)
	}
	del := func() *api.DeleteProjectHTTPResponse {
		t.Helper()
		d, err := w.Alice.DeleteProjectWithResponse(ctx, proj, &api.DeleteProjectParams{})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}

	// Live (active, then releasing): 409, and nothing changed.
	before := w.history(t, proj)
	if before["usage_records"] != 1 || before["rated_lines"] == 0 || before["allocations"] != 1 {
		t.Fatalf("the allocation left no history to keep: %v", before)
	}
	d := del()
	wantError(t, d.Body, d.StatusCode(), 409, "invalid_request", "project_in_use")
	sameHistory(t, "after a refused delete", w.history(t, proj), before)
	if g, _ := w.Alice.GetProjectWithResponse(ctx, proj, &api.GetProjectParams{}); g.StatusCode() != 200 {
		t.Fatalf("project after a refused delete: %d %s", g.StatusCode(), g.Body)
	}
	if ga, _ := w.Alice.GetAllocationWithResponse(ctx, a.ID, &api.GetAllocationParams{XProjectID: proj}); ga.StatusCode() != 200 || ga.JSON200.Status != "active" {
		t.Fatalf("the allocation after a refused delete: %s", ga.Body)
	}
	rel, _ := w.Alice.ReleaseAllocationWithResponse(ctx, a.ID, &api.ReleaseAllocationParams{XProjectID: proj})
	if rel.StatusCode() != 200 || rel.JSON200.Status != "releasing" {
		t.Fatalf("release: %d %s", rel.StatusCode(), rel.Body)
	}
	d = del()
	wantError(t, d.Body, d.StatusCode(), 409, "invalid_request", "project_in_use")
	clk.Advance(time.Minute)
	if err := w.report(t, node, w.task(t, a.ID, allocations.TaskRelease), true, ""); err != nil {
		t.Fatal(err)
	}

	// Released: deleted, history intact (one more audit row: the deletion itself).
	before = w.history(t, proj)
	projects := w.stats(t)
	d = del()
	if d.StatusCode() != 200 || !d.JSON200.Ok || d.JSON200.ProjectID != proj {
		t.Fatalf("delete: %d %s", d.StatusCode(), d.Body)
	}
	before["audit_rows"]++
	sameHistory(t, "after the delete", w.history(t, proj), before)
	if n := w.count(t, `SELECT count(*) FROM projects WHERE id = $1 AND deleted_at IS NOT NULL`, proj); n != 1 {
		t.Fatal("the project row is not kept as deleted")
	}
	if got := w.stats(t); got != projects-1 {
		t.Fatalf("internal stats count %d projects, want %d", got, projects-1)
	}

	// Gone: refused like a project that does not exist, listed nowhere.
	g, _ := w.Alice.GetProjectWithResponse(ctx, proj, &api.GetProjectParams{})
	wantError(t, g.Body, g.StatusCode(), 403, "insufficient_permissions", "")
	d = del()
	wantError(t, d.Body, d.StatusCode(), 403, "insufficient_permissions", "")
	ga, _ := w.Alice.GetAllocationWithResponse(ctx, a.ID, &api.GetAllocationParams{XProjectID: proj})
	wantError(t, ga.Body, ga.StatusCode(), 403, "insufficient_permissions", "")
	r, err = w.create(w.Alice, proj, "", api.CreateAllocationJSONRequestBody{Name: "again", Sku: sku1x})
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, r.Body, r.StatusCode(), 403, "insufficient_permissions", "")
	l, _ := w.Alice.ListProjectsWithResponse(ctx, &api.ListProjectsParams{})
	if l.StatusCode() != 200 {
		t.Fatalf("list: %s", l.Body)
	}
	for _, p := range l.JSON200.Items {
		if p.ID == proj {
			t.Fatal("the deleted project is still listed")
		}
	}
	// Its slug is free.
	cp, err = w.Alice.CreateProjectWithResponse(ctx, &api.CreateProjectParams{}, api.CreateProjectJSONRequestBody{Name: "Scratch", Slug: ptr("scratch")})
	if err != nil || cp.StatusCode() != 201 || cp.JSON201.Project.ID == proj {
		t.Fatalf("reuse the slug: %v %s", err, cp.Body)
	}
	if w.Validated.Load() == 0 {
		t.Fatal("no response was validated against the contract")
	}
}

// A launch whose project check passed just before its project was deleted: its insert
// waits for the deletion (trigger allocations_project_live), then is refused with the
// answer of a project that does not exist, and nothing of it stays.
func TestCreateRacingAProjectDeletion(t *testing.T) {
	w := newWorld(t, 16)
	ctx := context.Background()
	w.node(t, "n", 2)
	cp, err := w.Alice.CreateProjectWithResponse(ctx, &api.CreateProjectParams{}, api.CreateProjectJSONRequestBody{Name: "Racing"})
	if err != nil || cp.StatusCode() != 201 {
		t.Fatalf("create project: %v %s", err, cp.Body)
	}
	proj := cp.JSON201.Project.ID
	// The deletion, held open: the project row locked and marked, not yet committed.
	tx, err := w.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT id FROM projects WHERE id = $1 FOR UPDATE`, proj); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE projects SET deleted_at = now() WHERE id = $1`, proj); err != nil {
		t.Fatal(err)
	}
	before := w.writes(t)
	done := make(chan *api.CreateAllocationHTTPResponse, 1)
	go func() {
		r, err := w.create(w.Alice, proj, "", api.CreateAllocationJSONRequestBody{Name: "late", Sku: sku1x})
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	deadline := time.Now().Add(10 * time.Second) // bounds a hang; asserts no timing
	for w.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the launch never waited on the deletion")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	wantError(t, r.Body, r.StatusCode(), 403, "insufficient_permissions", "")
	if got := w.writes(t); got != before {
		t.Fatalf("the refused launch wrote: %v -> %v", before, got)
	}
}
