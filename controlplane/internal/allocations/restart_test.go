package allocations_test

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/proto/api"
)

func (w *world) restart(c *api.ClientWithResponses, project, id uuid.UUID) *api.RestartAllocationHTTPResponse {
	r, err := c.RestartAllocationWithResponse(context.Background(), id, &api.RestartAllocationParams{XProjectID: project})
	if err != nil {
		panic(err)
	}
	return r
}

// activate reports the allocation's provisioning task done: it becomes active.
func (w *world) activate(t *testing.T, node, id uuid.UUID) {
	t.Helper()
	if err := w.report(t, node, w.task(t, id, allocations.TaskProvision), true, `{"host":"10.7.0.1","port":22,"user":"gantry-a1"}`); err != nil {
		t.Fatal(err)
	}
	var status string
	if err := w.Pool.QueryRow(context.Background(), `SELECT status FROM allocations WHERE id = $1`, id).Scan(&status); err != nil || status != "active" {
		t.Fatalf("not active: %s %v", status, err)
	}
}

func (w *world) tasks(t *testing.T, id uuid.UUID, kind string) int {
	return w.count(t, `SELECT count(*) FROM allocation_tasks WHERE allocation_id = $1 AND kind = $2`, id, kind)
}

// Restart walks active -> restarting -> restart_failed -> restarting -> active, and is
// refused where the lifecycle refuses it, writing nothing then.
func TestRestart(t *testing.T) {
	w := newWorld(t, 16)
	ctx := context.Background()
	node := w.node(t, "n", 2)
	proj := w.Acme.DefaultProject
	a := w.mustCreate(t, "train")

	// requested: not started yet.
	before := w.writes(t)
	r := w.restart(w.Alice, proj, a.ID)
	wantError(t, r.Body, r.StatusCode(), 409, "allocation_not_active", "not_started")
	if after := w.writes(t); after != before {
		t.Fatalf("a refused restart wrote: %v -> %v", before, after)
	}
	r = w.restart(w.Alice, proj, uuid.New())
	wantError(t, r.Body, r.StatusCode(), 404, "allocation_not_found", "")

	w.activate(t, node, a.ID)

	// A viewer may read but not restart; another tenant does not see it.
	viewerID, viewerTok := w.NewUser(t, w.Acme.AdminToken, "member")
	if m, err := w.Alice.AddProjectMemberWithResponse(ctx, proj, &api.AddProjectMemberParams{}, api.AddProjectMemberRequest{UserID: viewerID, Role: api.ProjectRoleViewer}); err != nil || m.StatusCode() != 201 {
		t.Fatalf("add viewer: %v %s", err, m.Body)
	}
	r = w.restart(w.Client(viewerTok), proj, a.ID)
	wantError(t, r.Body, r.StatusCode(), 403, "insufficient_permissions", "")
	other := w.NewTenant(t, w.rootToken(t), "Other")
	r = w.restart(w.Client(other.AdminToken), other.DefaultProject, a.ID)
	wantError(t, r.Body, r.StatusCode(), 404, "allocation_not_found", "")
	if got := w.status(t, a.ID); got.Status != "active" {
		t.Fatalf("refused restarts moved it: %s", got.Status)
	}

	// active -> restarting: a restart task, status event, outbox events, audit row.
	r = w.restart(w.Alice, proj, a.ID)
	if r.StatusCode() != 200 || r.JSON200.Status != "restarting" {
		t.Fatalf("restart: %d %s", r.StatusCode(), r.Body)
	}
	if n := w.tasks(t, a.ID, allocations.TaskRestart); n != 1 {
		t.Fatalf("restart tasks: %d", n)
	}
	first := w.task(t, a.ID, allocations.TaskRestart)
	if n := w.count(t, `SELECT count(*) FROM outbox_events WHERE event_type = 'provisioning.dispatch' AND payload->>'task_id' = $1`, first); n != 1 {
		t.Fatalf("dispatch events of the restart task: %d", n)
	}
	if n := w.count(t, `SELECT count(*) FROM audit_events WHERE action = 'allocation.restart' AND target_id = $1`, a.ID.String()); n != 1 {
		t.Fatalf("restart audit rows: %d", n)
	}
	// Restarting keeps billing (the GPUs stay reserved).
	if n := w.openUsage(t, a.ID); n != 1 {
		t.Fatalf("open usage while restarting: %d", n)
	}
	// restarting: a second restart is not eligible.
	before = w.writes(t)
	r = w.restart(w.Alice, proj, a.ID)
	wantError(t, r.Body, r.StatusCode(), 409, "allocation_not_active", "status_not_eligible")
	if after := w.writes(t); after != before {
		t.Fatalf("a refused restart wrote: %v -> %v", before, after)
	}

	// The agent fails the restart: restart_failed, still billed, GPUs kept.
	if err := w.report(t, node, first, false, ""); err != nil {
		t.Fatal(err)
	}
	if got := w.status(t, a.ID); got.Status != "restart_failed" || got.StatusReason == nil {
		t.Fatalf("restart_failed: %+v", got)
	}
	if n := w.openUsage(t, a.ID); n != 1 {
		t.Fatalf("open usage after a failed restart: %d", n)
	}
	// restart_failed -> restarting with a new task id; the agent succeeds: active, with
	// the new connection details.
	r = w.restart(w.Alice, proj, a.ID)
	if r.StatusCode() != 200 || r.JSON200.Status != "restarting" {
		t.Fatalf("restart after failure: %d %s", r.StatusCode(), r.Body)
	}
	second := w.task(t, a.ID, allocations.TaskRestart)
	if second == first {
		t.Fatal("the second restart reused the task id")
	}
	if err := w.report(t, node, second, true, `{"host":"10.7.0.9","port":2222,"user":"gantry-a1"}`); err != nil {
		t.Fatal(err)
	}
	got := w.status(t, a.ID)
	if got.Status != "active" || got.Connection == nil || got.Connection.Port != 2222 || got.Connection.Host != "10.7.0.9" {
		t.Fatalf("active after restart: %+v", got)
	}
	// A late failure report of the first task does not fit any more (a late success is
	// a repeat of active and writes nothing).
	if err := w.report(t, node, first, false, ""); err == nil {
		t.Fatal("late restart failure accepted")
	}

	// Idle allocations restart too (covered in the idle test); releasing ones refuse.
	rel, _ := w.Alice.ReleaseAllocationWithResponse(ctx, a.ID, &api.ReleaseAllocationParams{XProjectID: proj})
	if rel.StatusCode() != 200 {
		t.Fatalf("release: %s", rel.Body)
	}
	r = w.restart(w.Alice, proj, a.ID)
	wantError(t, r.Body, r.StatusCode(), 409, "allocation_already_releasing", "release_in_progress")
	if err := w.report(t, node, w.task(t, a.ID, allocations.TaskRelease), true, ""); err != nil {
		t.Fatal(err)
	}
	r = w.restart(w.Alice, proj, a.ID)
	wantError(t, r.Body, r.StatusCode(), 409, "allocation_not_active", "final_state")

	ev, _ := w.Alice.ListAllocationEventsWithResponse(ctx, a.ID, &api.ListAllocationEventsParams{XProjectID: proj})
	want := []string{"requested", "active", "restarting", "restart_failed", "restarting", "active", "releasing", "released"}
	if ev.StatusCode() != 200 || len(ev.JSON200.Items) != len(want) {
		t.Fatalf("events: %s", ev.Body)
	}
	for i, e := range ev.JSON200.Items {
		if string(e.ToStatus) != want[i] {
			t.Fatalf("event %d: %s, want %s", i, e.ToStatus, want[i])
		}
	}
	if e := ev.JSON200.Items[2]; e.Event != "restart" || e.ActorType != "user" {
		t.Fatalf("restart event: %+v", e)
	}

	// A failed allocation cannot restart.
	b := w.mustCreate(t, "doomed")
	if err := w.report(t, b.NodeID, w.task(t, b.ID, allocations.TaskProvision), false, ""); err != nil {
		t.Fatal(err)
	}
	r = w.restart(w.Alice, proj, b.ID)
	wantError(t, r.Body, r.StatusCode(), 409, "allocation_not_active", "final_state")
}
