package allocations_test

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// A task the agent acknowledged and never reported on fails after the report timeout
// (30m by default): provision -> failed with the node flagged for cleanup, release ->
// release_failed (and a retry is accepted); a task still within the timeout, and one
// whose allocation moved on, are left as they are or only closed; a second sweep writes
// nothing, and a report arriving afterwards changes nothing.
func TestReportTimeout(t *testing.T) {
	w, clk := clockWorld(t, 16)
	ctx := t.Context()
	node := w.node(t, "n", 4)
	proj := w.Acme.DefaultProject

	ack := func(t *testing.T, task string) {
		t.Helper()
		if recorded, err := w.App.Allocations.TaskAcknowledged(ctx, uuid.MustParse(task), 1); err != nil || !recorded {
			t.Fatalf("acknowledge %s: %v %v", task, recorded, err)
		}
	}
	sweep := func(t *testing.T, want allocations.ReportTimeoutStats) {
		t.Helper()
		got, err := w.App.Allocations.ExpireUnreported(ctx)
		if err != nil || got != want {
			t.Fatalf("sweep: %+v %v, want %+v", got, err, want)
		}
	}
	finished := func(task string) int {
		return w.count(t, `SELECT count(*) FROM allocation_tasks WHERE task_id = $1 AND finished_at IS NOT NULL AND last_error LIKE 'report_timeout: %'`, uuid.MustParse(task))
	}
	events := func(typ string, id uuid.UUID) int {
		return w.count(t, `SELECT count(*) FROM outbox_events WHERE event_type = $1 AND payload->>'allocation_id' = $2`, typ, id.String())
	}

	// p: provisioning, acknowledged at 0; b: acknowledged at 29m; m: acknowledged at 0,
	// then released by its user before the agent reported (the allocation moved on).
	p := w.mustCreate(t, "p")
	pTask := w.task(t, p.ID, allocations.TaskProvision)
	ack(t, pTask)
	m := w.mustCreate(t, "m")
	mTask := w.task(t, m.ID, allocations.TaskProvision)
	ack(t, mTask)
	if r, _ := w.Alice.ReleaseAllocationWithResponse(ctx, m.ID, &api.ReleaseAllocationParams{XProjectID: proj}); r.StatusCode() != 200 {
		t.Fatalf("release m: %s", r.Body)
	}
	clk.Advance(29 * time.Minute)
	b := w.mustCreate(t, "b")
	bTask := w.task(t, b.ID, allocations.TaskProvision)
	ack(t, bTask)
	if got := w.status(t, p.ID); got.Status != "provisioning" {
		t.Fatalf("p after its acknowledgement: %s", got.Status)
	}

	// Within the timeout: nothing.
	sweep(t, allocations.ReportTimeoutStats{})

	clk.Advance(2 * time.Minute) // p and m at 31m, b at 2m
	sweep(t, allocations.ReportTimeoutStats{Failed: 1, Finished: 1})
	got := w.status(t, p.ID)
	if got.Status != "failed" || got.StatusReason == nil ||
		*got.StatusReason != "report_timeout: node acknowledged the allocation.provision task but did not report within 30m" {
		t.Fatalf("p: %s %v", got.Status, got.StatusReason)
	}
	// The node may still run p's workload: its GPU stays held until the node confirms
	// it gone (cleanup_test.go follows that through).
	if n := w.heldGPUs(t, p.ID); n != 1 || w.cleanupTask(t, p.ID) == "" {
		t.Fatalf("p holds %d GPUs (want 1, cleanup pending), cleanup task %q", n, w.cleanupTask(t, p.ID))
	}
	if n := w.count(t, `SELECT count(*) FROM allocations WHERE id = $1 AND node_cleanup`, p.ID); n != 1 {
		t.Fatal("p's node not flagged for cleanup")
	}
	if finished(pTask) != 1 || events("provisioning.failed", p.ID) != 1 || w.openUsage(t, p.ID) != 0 {
		t.Fatal("p's task not finished, provisioning.failed not emitted once, or usage open")
	}
	// m's provision task is closed; m itself waits for its release as before.
	if finished(mTask) != 1 || w.status(t, m.ID).Status != "releasing" || events("provisioning.failed", m.ID) != 0 {
		t.Fatalf("m: task closed %d, status %s", finished(mTask), w.status(t, m.ID).Status)
	}
	if w.status(t, b.ID).Status != "provisioning" || finished(bTask) != 0 {
		t.Fatal("b failed within its timeout")
	}

	// A second sweep finds nothing; the agent's late report changes nothing.
	before := w.writes(t)
	sweep(t, allocations.ReportTimeoutStats{})
	// The late report is refused by the lifecycle (provisioned does not apply to a
	// failed allocation), not lost to some other error.
	if e, ok := apierr.As(w.report(t, node, pTask, true, `{"host":"h","port":22,"user":"u"}`)); !ok || e.Details["reason"] != "allocation_transition_invalid" {
		t.Fatalf("late report: %v", e)
	}
	if w.writes(t) != before || w.status(t, p.ID).Status != "failed" {
		t.Fatal("a late report or a second sweep wrote something")
	}

	// b becomes active; its release is acknowledged and never reported.
	if err := w.report(t, node, bTask, true, `{"host":"h","port":22,"user":"u"}`); err != nil {
		t.Fatal(err)
	}
	if r, _ := w.Alice.ReleaseAllocationWithResponse(ctx, b.ID, &api.ReleaseAllocationParams{XProjectID: proj}); r.StatusCode() != 200 {
		t.Fatalf("release b: %s", r.Body)
	}
	relTask := w.task(t, b.ID, allocations.TaskRelease)
	ack(t, relTask)
	clk.Advance(30*time.Minute + time.Second)
	sweep(t, allocations.ReportTimeoutStats{Failed: 1})
	got = w.status(t, b.ID)
	if got.Status != "release_failed" || got.StatusReason == nil ||
		*got.StatusReason != "report_timeout: node acknowledged the allocation.release task but did not report within 30m" {
		t.Fatalf("b: %s %v", got.Status, got.StatusReason)
	}
	if events("provisioning.release_failed", b.ID) != 1 || w.openUsage(t, b.ID) != 0 {
		t.Fatal("provisioning.release_failed not emitted once, or usage still open")
	}
	if n := w.count(t, `SELECT count(*) FROM allocations WHERE id = $1 AND node_cleanup`, b.ID); n != 0 {
		t.Fatal("a release timeout flagged the node: the retry's task does the cleanup")
	}
	// The retry sends a new release task.
	if r, _ := w.Alice.ReleaseAllocationWithResponse(ctx, b.ID, &api.ReleaseAllocationParams{XProjectID: proj}); r.StatusCode() != 200 || w.task(t, b.ID, allocations.TaskRelease) == relTask {
		t.Fatalf("retry: %s", r.Body)
	}

	// A restart whose acknowledged task a newer restart task replaced: the old task is
	// only closed, the newer restart goes on. (Restarting is entered by its own feature;
	// the rows are set up directly.)
	c := w.mustCreate(t, "c")
	if _, err := w.Pool.Exec(ctx, `UPDATE allocations SET status = 'restarting' WHERE id = $1`, c.ID); err != nil {
		t.Fatal(err)
	}
	old, newer := uuid.New(), uuid.New()
	for i, id := range []uuid.UUID{old, newer} {
		if _, err := w.Pool.Exec(ctx, `INSERT INTO allocation_tasks (task_id, allocation_id, node_id, kind, created_at) VALUES ($1, $2, $3, 'allocation.restart', $4)`,
			id, c.ID, node, clk.Now().Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	ack(t, old.String())
	clk.Advance(31 * time.Minute)
	sweep(t, allocations.ReportTimeoutStats{Finished: 1})
	if finished(old.String()) != 1 || w.status(t, c.ID).Status != "restarting" {
		t.Fatalf("superseded restart: closed %d, status %s", finished(old.String()), w.status(t, c.ID).Status)
	}
}
