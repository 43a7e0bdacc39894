package allocations_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/proto/api"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// task is the latest task of kind sent for the allocation.
func (w *world) task(t *testing.T, alloc uuid.UUID, kind string) string {
	t.Helper()
	var id uuid.UUID
	if err := w.Pool.QueryRow(context.Background(),
		`SELECT task_id FROM allocation_tasks WHERE allocation_id = $1 AND kind = $2 ORDER BY created_at DESC, task_id DESC LIMIT 1`,
		alloc, kind).Scan(&id); err != nil {
		t.Fatalf("task %s of %s: %v", kind, alloc, err)
	}
	return id.String()
}

func (w *world) report(t *testing.T, node uuid.UUID, task string, ok bool, result string) error {
	t.Helper()
	r := &fabricv1.TaskResult{TaskId: task, Status: fabricv1.TaskResultStatus_TASK_RESULT_STATUS_SUCCEEDED, Result: []byte(result)}
	if !ok {
		r.Status, r.ErrorCode, r.Message = fabricv1.TaskResultStatus_TASK_RESULT_STATUS_FAILED, "cleanup_failed", "user processes still running"
	}
	return w.App.Allocations.TaskResult(context.Background(), node, r)
}

func (w *world) status(t *testing.T, id uuid.UUID) api.Allocation {
	t.Helper()
	g, err := w.Alice.GetAllocationWithResponse(context.Background(), id, &api.GetAllocationParams{XProjectID: w.Acme.DefaultProject})
	if err != nil || g.StatusCode() != 200 {
		t.Fatalf("get: %v %s", err, g.Body)
	}
	return *g.JSON200
}

func (w *world) openUsage(t *testing.T, id uuid.UUID) int {
	return w.count(t, `SELECT count(*) FROM billing_usage_records WHERE source = 'allocation' AND source_id = $1 AND bill_to IS NULL`, id)
}

// The agent's reports drive provisioning -> active (usage opens) and the release flow,
// including a failed release and its retry; repeats write nothing.
func TestAgentReportsDriveTheLifecycle(t *testing.T) {
	w := newWorld(t, 16)
	ctx := context.Background()
	node := w.node(t, "n", 2)
	a := w.mustCreate(t, "train")
	prov := w.task(t, a.ID, allocations.TaskProvision)

	// A report from another node, or for a task nobody sent, is refused.
	if err := w.report(t, uuid.New(), prov, true, ""); !errors.Is(err, allocations.ErrUnknownTask) {
		t.Fatalf("foreign node: %v", err)
	}
	if err := w.report(t, node, uuid.NewString(), true, ""); !errors.Is(err, allocations.ErrUnknownTask) {
		t.Fatalf("unknown task: %v", err)
	}

	if err := w.report(t, node, prov, true, `{"host":"10.7.0.1","port":22,"user":"gantry-a1"}`); err != nil {
		t.Fatal(err)
	}
	got := w.status(t, a.ID)
	if got.Status != "active" || got.ActiveAt == nil || got.Connection == nil || got.Connection.Host != "10.7.0.1" || got.Connection.Port != 22 || got.Connection.User != "gantry-a1" || got.Connection.ProxyCommand == nil {
		t.Fatalf("active: %+v", got)
	}
	if n := w.openUsage(t, a.ID); n != 1 {
		t.Fatalf("open usage records: %d", n)
	}
	events := w.count(t, `SELECT count(*) FROM allocation_events WHERE allocation_id = $1`, a.ID)
	if err := w.report(t, node, prov, true, `{"host":"10.7.0.1","port":22,"user":"gantry-a1"}`); err != nil {
		t.Fatalf("repeated report: %v", err)
	}
	if n := w.count(t, `SELECT count(*) FROM allocation_events WHERE allocation_id = $1`, a.ID); n != events {
		t.Fatalf("a repeated report wrote events: %d -> %d", events, n)
	}

	rel, _ := w.Alice.ReleaseAllocationWithResponse(ctx, a.ID, &api.ReleaseAllocationParams{XProjectID: w.Acme.DefaultProject})
	if rel.StatusCode() != 200 || rel.JSON200.Status != "releasing" {
		t.Fatalf("release: %s", rel.Body)
	}
	if n := w.openUsage(t, a.ID); n != 1 {
		t.Fatalf("releasing keeps billing until the node answers: %d", n)
	}
	if err := w.report(t, node, w.task(t, a.ID, allocations.TaskRelease), false, ""); err != nil {
		t.Fatal(err)
	}
	got = w.status(t, a.ID)
	if got.Status != "release_failed" || got.StatusReason == nil || *got.StatusReason != "cleanup_failed: user processes still running" {
		t.Fatalf("release_failed: %+v", got)
	}
	if n := w.openUsage(t, a.ID); n != 0 {
		t.Fatalf("release_failed stops billing: %d open", n)
	}
	if n := w.count(t, `SELECT count(*) FROM allocation_gpus WHERE allocation_id = $1 AND released_at IS NULL`, a.ID); n != 1 {
		t.Fatalf("release_failed keeps the GPU: %d", n)
	}
	// Retry: a new release task.
	first := w.task(t, a.ID, allocations.TaskRelease)
	rel, _ = w.Alice.ReleaseAllocationWithResponse(ctx, a.ID, &api.ReleaseAllocationParams{XProjectID: w.Acme.DefaultProject})
	if rel.StatusCode() != 200 || rel.JSON200.Status != "releasing" {
		t.Fatalf("retry: %s", rel.Body)
	}
	second := w.task(t, a.ID, allocations.TaskRelease)
	if second == first {
		t.Fatal("the retry reused the release task id (the agent would not run it again)")
	}
	if err := w.report(t, node, second, true, ""); err != nil {
		t.Fatal(err)
	}
	got = w.status(t, a.ID)
	if got.Status != "released" || got.EndedAt == nil {
		t.Fatalf("released: %+v", got)
	}
	if n := w.count(t, `SELECT count(*) FROM allocation_gpus WHERE allocation_id = $1 AND released_at IS NULL`, a.ID); n != 0 {
		t.Fatalf("released GPUs still held: %d", n)
	}
	if used, err := w.App.Nodes.Allocations.NodeInUse(ctx, node); err != nil || used {
		t.Fatalf("node still in use: %v %v", used, err)
	}
	// A late report of the first release task does not fit any more.
	if err := w.report(t, node, first, false, ""); err == nil {
		t.Fatal("late report accepted")
	}
	ev, _ := w.Alice.ListAllocationEventsWithResponse(ctx, a.ID, &api.ListAllocationEventsParams{XProjectID: w.Acme.DefaultProject})
	want := []string{"requested", "active", "releasing", "release_failed", "releasing", "released"}
	if ev.StatusCode() != 200 || len(ev.JSON200.Items) != len(want) {
		t.Fatalf("events: %s", ev.Body)
	}
	for i, e := range ev.JSON200.Items {
		if string(e.ToStatus) != want[i] {
			t.Fatalf("event %d: %s, want %s", i, e.ToStatus, want[i])
		}
	}
	if e := ev.JSON200.Items[1]; e.ActorType != "node" || e.ActorID == nil || *e.ActorID != node.String() {
		t.Fatalf("report event actor: %+v", e)
	}
}

// A failed provisioning is final and frees the GPUs at once.
func TestProvisioningFailureFreesGPUs(t *testing.T) {
	w := newWorld(t, 16)
	node := w.node(t, "n", 1)
	a := w.mustCreate(t, "train")
	if err := w.report(t, node, w.task(t, a.ID, allocations.TaskProvision), false, ""); err != nil {
		t.Fatal(err)
	}
	if got := w.status(t, a.ID); got.Status != "failed" || got.StatusReason == nil {
		t.Fatalf("failed: %+v", got)
	}
	// The only GPU is free again: the next launch gets it.
	b := w.mustCreate(t, "again")
	if b.NodeID != node {
		t.Fatalf("placed on %s", b.NodeID)
	}
}

func TestAdminListAndForceRelease(t *testing.T) {
	w := newWorld(t, 16)
	ctx := context.Background()
	w.node(t, "n", 2)
	a := w.mustCreate(t, "stuck")
	w.mustCreate(t, "other")

	l, _ := w.Alice.ListAdminAllocationsWithResponse(ctx, &api.ListAdminAllocationsParams{})
	wantError(t, l.Body, l.StatusCode(), 403, "admin_required", "")
	fr, _ := w.Alice.ForceReleaseAllocationWithResponse(ctx, a.ID, &api.ForceReleaseAllocationParams{})
	wantError(t, fr.Body, fr.StatusCode(), 403, "admin_required", "")

	l, _ = w.Root.ListAdminAllocationsWithResponse(ctx, &api.ListAdminAllocationsParams{TenantID: &w.Acme.ID, PageSize: ptr(1)})
	if l.StatusCode() != 200 || len(l.JSON200.Items) != 1 || l.JSON200.Items[0].TenantID != w.Acme.ID || l.JSON200.Pagination.NextCursor == nil {
		t.Fatalf("admin list: %s", l.Body)
	}
	other := uuid.New()
	l, _ = w.Root.ListAdminAllocationsWithResponse(ctx, &api.ListAdminAllocationsParams{TenantID: &other})
	if l.StatusCode() != 200 || len(l.JSON200.Items) != 0 {
		t.Fatalf("admin list of another tenant: %s", l.Body)
	}

	fr, _ = w.Root.ForceReleaseAllocationWithResponse(ctx, a.ID, &api.ForceReleaseAllocationParams{})
	if fr.StatusCode() != 200 || fr.JSON200.Status != "released" {
		t.Fatalf("force-release: %d %s", fr.StatusCode(), fr.Body)
	}
	if n := w.count(t, `SELECT count(*) FROM allocations WHERE id = $1 AND node_cleanup`, a.ID); n != 1 {
		t.Fatal("not flagged for node cleanup")
	}
	// Nothing confirmed the node clean: the GPU stays held until the node's cleanup task
	// succeeds (GPU ownership, docs/allocation-lifecycle.md).
	if n := w.heldGPUs(t, a.ID); n != 1 {
		t.Fatalf("GPUs held after force-release: %d, want 1 (cleanup pending)", n)
	}
	if err := w.report(t, w.nodeOf(t, a.ID), w.cleanupTask(t, a.ID), true, ""); err != nil {
		t.Fatal(err)
	}
	if n := w.heldGPUs(t, a.ID); n != 0 {
		t.Fatalf("GPUs still held after the node's cleanup: %d", n)
	}
	if n := w.count(t, `SELECT count(*) FROM audit_events WHERE action = 'allocation.force_release' AND target_id = $1`, a.ID.String()); n != 1 {
		t.Fatalf("audit rows: %d", n)
	}
	fr, _ = w.Root.ForceReleaseAllocationWithResponse(ctx, a.ID, &api.ForceReleaseAllocationParams{})
	wantError(t, fr.Body, fr.StatusCode(), 409, "allocation_already_releasing", "already_released")
	fr, _ = w.Root.ForceReleaseAllocationWithResponse(ctx, uuid.New(), &api.ForceReleaseAllocationParams{})
	wantError(t, fr.Body, fr.StatusCode(), 404, "allocation_not_found", "")
	status := api.V3WorkloadStatus("released")
	l, _ = w.Root.ListAdminAllocationsWithResponse(ctx, &api.ListAdminAllocationsParams{Status: &status})
	if l.StatusCode() != 200 || len(l.JSON200.Items) != 1 || l.JSON200.Items[0].ID != a.ID {
		t.Fatalf("admin list by status: %s", l.Body)
	}
}
