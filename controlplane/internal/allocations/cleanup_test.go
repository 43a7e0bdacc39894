package allocations_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/proto/api"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// heldGPUs counts the GPUs of allocation id that placement may not give away.
func (w *world) heldGPUs(t *testing.T, id uuid.UUID) int {
	t.Helper()
	return w.count(t, `SELECT count(*) FROM allocation_gpus WHERE allocation_id = $1 AND released_at IS NULL`, id)
}

// cleanupTask is the open cleanup task of the allocation ("" when none).
func (w *world) cleanupTask(t *testing.T, id uuid.UUID) string {
	t.Helper()
	var tid uuid.UUID
	err := w.Pool.QueryRow(context.Background(), `SELECT task_id FROM allocation_tasks
		WHERE allocation_id = $1 AND cleanup AND finished_at IS NULL ORDER BY created_at DESC, task_id DESC LIMIT 1`, id).Scan(&tid)
	if err != nil {
		return ""
	}
	return tid.String()
}

// nodeOf is the node the allocation is placed on.
func (w *world) nodeOf(t *testing.T, id uuid.UUID) uuid.UUID {
	t.Helper()
	var n uuid.UUID
	if err := w.Pool.QueryRow(context.Background(), `SELECT node_id FROM allocations WHERE id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func createBody(name string) api.CreateAllocationJSONRequestBody {
	return api.CreateAllocationJSONRequestBody{Name: name, Sku: sku1x}
}

func hello(reported bool, running []string, held ...string) *fabricv1.Hello {
	h := &fabricv1.Hello{WorkloadsReported: reported, ActiveTaskIds: running}
	for _, id := range held {
		h.Workloads = append(h.Workloads, &fabricv1.HeldWorkload{AllocationId: id, Phase: "active"})
	}
	return h
}

// The report timeout fails a provision the agent took and never reported on, but the
// node may run the workload: its GPU stays out of placement (a create on the full node
// is sku_unavailable), the node gets a cleanup task, and a reconnect that still lists
// the workload changes nothing. Only the cleanup task's success frees the GPU.
func TestReportTimeoutKeepsGPUsUntilTheNodeConfirms(t *testing.T) {
	w, clk := clockWorld(t, 16)
	ctx := t.Context()
	node := w.node(t, "n", 1)
	a := w.mustCreate(t, "lost")
	prov := w.task(t, a.ID, allocations.TaskProvision)
	if _, err := w.App.Allocations.TaskAcknowledged(ctx, uuid.MustParse(prov), 1); err != nil {
		t.Fatal(err)
	}
	clk.Advance(31 * time.Minute)
	if st, err := w.App.Allocations.ExpireUnreported(ctx); err != nil || st.Failed != 1 {
		t.Fatalf("sweep: %+v %v", st, err)
	}
	if got := w.status(t, a.ID).Status; got != "failed" {
		t.Fatalf("status %s", got)
	}
	if n := w.heldGPUs(t, a.ID); n != 1 {
		t.Fatalf("GPUs held after the report timeout: %d, want 1 (cleanup pending)", n)
	}
	cleanup := w.cleanupTask(t, a.ID)
	if cleanup == "" {
		t.Fatal("no cleanup task")
	}
	if dt := w.dispatchTask(t, uuid.MustParse(cleanup)); !dt.Pending() || dt.Kind != allocations.TaskRelease || dt.Payload.AllocationID != a.ID.String() {
		t.Fatalf("cleanup task for the dispatcher: %+v", dt)
	}
	r, err := w.create(w.Alice, w.Acme.DefaultProject, "", createBody("next"))
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, r.Body, r.StatusCode(), 409, "sku_unavailable", "")

	// The agent reconnects still holding the workload: nothing freed, no second task.
	if err := w.App.Allocations.Reconcile(ctx, node, hello(true, nil, a.ID.String())); err != nil {
		t.Fatal(err)
	}
	if w.heldGPUs(t, a.ID) != 1 || w.cleanupTask(t, a.ID) != cleanup ||
		w.count(t, `SELECT count(*) FROM allocation_tasks WHERE allocation_id = $1 AND cleanup`, a.ID) != 1 {
		t.Fatal("a reconcile that lists the workload freed the GPU or sent another cleanup task")
	}
	// Its late provision report is refused for good and frees nothing either.
	if err := w.App.Allocations.OnTaskResult(ctx, node, &fabricv1.TaskResult{TaskId: prov, Status: fabricv1.TaskResultStatus_TASK_RESULT_STATUS_SUCCEEDED,
		Result: []byte(`{"host":"h","port":22,"user":"u"}`)}); err != nil {
		t.Fatal(err)
	}
	if w.heldGPUs(t, a.ID) != 1 || w.status(t, a.ID).Status != "failed" {
		t.Fatal("the late report changed the allocation or freed its GPU")
	}

	// A failed cleanup keeps the GPU; a succeeded one frees it.
	if err := w.report(t, node, cleanup, false, ""); err != nil {
		t.Fatal(err)
	}
	if w.heldGPUs(t, a.ID) != 1 || w.count(t, `SELECT count(*) FROM allocations WHERE id = $1 AND node_cleanup`, a.ID) != 1 {
		t.Fatal("a failed cleanup freed the GPU")
	}
	// The next reconcile sends another cleanup task; its success confirms.
	if err := w.App.Allocations.Reconcile(ctx, node, hello(true, nil, a.ID.String())); err != nil {
		t.Fatal(err)
	}
	again := w.cleanupTask(t, a.ID)
	if again == "" || again == cleanup {
		t.Fatalf("no new cleanup task after the failed one: %q", again)
	}
	if err := w.report(t, node, again, true, ""); err != nil {
		t.Fatal(err)
	}
	if w.heldGPUs(t, a.ID) != 0 || w.count(t, `SELECT count(*) FROM allocations WHERE id = $1 AND node_cleanup`, a.ID) != 0 {
		t.Fatal("the cleanup's success did not free the GPU")
	}
	if w.status(t, a.ID).Status != "failed" {
		t.Fatal("the cleanup moved the allocation")
	}
	w.mustCreate(t, "next")
}

// A reconnecting agent that does not hold the workload confirms it gone — unless one of
// the allocation's tasks is still running there (the workload may appear yet), or the
// agent reports no workload list at all.
func TestReconcileConfirmsAbsentWorkloads(t *testing.T) {
	w, clk := clockWorld(t, 16)
	ctx := t.Context()
	node := w.node(t, "n", 1)
	a := w.mustCreate(t, "lost")
	prov := w.task(t, a.ID, allocations.TaskProvision)
	if _, err := w.App.Allocations.TaskAcknowledged(ctx, uuid.MustParse(prov), 1); err != nil {
		t.Fatal(err)
	}
	clk.Advance(31 * time.Minute)
	if _, err := w.App.Allocations.ExpireUnreported(ctx); err != nil {
		t.Fatal(err)
	}
	for name, h := range map[string]*fabricv1.Hello{
		"no workload list":        hello(false, nil),
		"provision still running": hello(true, []string{prov}),
		"another node":            hello(true, nil),
	} {
		n := node
		if name == "another node" {
			n = w.node(t, "other", 1)
		}
		if err := w.App.Allocations.Reconcile(ctx, n, h); err != nil {
			t.Fatal(err)
		}
		if w.heldGPUs(t, a.ID) != 1 {
			t.Fatalf("%s: GPU freed", name)
		}
	}
	if err := w.App.Allocations.Reconcile(ctx, node, hello(true, nil)); err != nil {
		t.Fatal(err)
	}
	if w.heldGPUs(t, a.ID) != 0 || w.cleanupTask(t, a.ID) != "" || w.count(t, `SELECT count(*) FROM allocations WHERE id = $1 AND node_cleanup`, a.ID) != 0 {
		t.Fatal("an absent workload was not confirmed gone")
	}
	w.mustCreate(t, "next")
}

// A workload the node still holds for an allocation that has ended gets a cleanup task;
// one for a live allocation is left alone.
func TestReconcileCleansUpEndedWorkloads(t *testing.T) {
	w := newWorld(t, 16)
	ctx := context.Background()
	node := w.node(t, "n", 2)
	live := w.mustCreate(t, "live")
	ended := w.mustCreate(t, "ended")
	if err := w.report(t, node, w.task(t, ended.ID, allocations.TaskProvision), false, ""); err != nil {
		t.Fatal(err)
	}
	if w.status(t, ended.ID).Status != "failed" || w.heldGPUs(t, ended.ID) != 0 {
		t.Fatal("setup: the agent's failure report frees the GPU")
	}
	if err := w.App.Allocations.Reconcile(ctx, node, hello(true, nil, live.ID.String(), ended.ID.String(), uuid.NewString())); err != nil {
		t.Fatal(err)
	}
	if w.cleanupTask(t, live.ID) != "" || w.status(t, live.ID).Status != "requested" {
		t.Fatal("a live allocation got a cleanup task")
	}
	task := w.cleanupTask(t, ended.ID)
	if task == "" || w.count(t, `SELECT count(*) FROM allocations WHERE id = $1 AND node_cleanup`, ended.ID) != 1 {
		t.Fatal("the ended allocation's workload got no cleanup task")
	}
	// Its GPU, free since the failure report and claimed by nobody, is held again until
	// the cleanup is confirmed: the node is full.
	if w.heldGPUs(t, ended.ID) != 1 {
		t.Fatal("the GPU of a workload still on the node was not held again")
	}
	r, err := w.create(w.Alice, w.Acme.DefaultProject, "", createBody("next"))
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, r.Body, r.StatusCode(), 409, "sku_unavailable", "")
	// Reconciling again sends no second task; the task's success clears the flag.
	if err := w.App.Allocations.Reconcile(ctx, node, hello(true, nil, ended.ID.String())); err != nil {
		t.Fatal(err)
	}
	if w.count(t, `SELECT count(*) FROM allocation_tasks WHERE allocation_id = $1 AND cleanup`, ended.ID) != 1 {
		t.Fatal("a second cleanup task")
	}
	if err := w.report(t, node, task, true, ""); err != nil {
		t.Fatal(err)
	}
	if w.count(t, `SELECT count(*) FROM allocations WHERE id = $1 AND node_cleanup`, ended.ID) != 0 || w.heldGPUs(t, ended.ID) != 0 {
		t.Fatal("cleanup not confirmed")
	}
	w.mustCreate(t, "next")
}

// A GPU that another allocation claimed after it was freed stays with that allocation:
// only the cleanup task goes out.
func TestReconcileLeavesAReclaimedGPUAlone(t *testing.T) {
	w := newWorld(t, 16)
	ctx := context.Background()
	node := w.node(t, "n", 1)
	ended := w.mustCreate(t, "ended")
	if err := w.report(t, node, w.task(t, ended.ID, allocations.TaskProvision), false, ""); err != nil {
		t.Fatal(err)
	}
	next := w.mustCreate(t, "next")
	if err := w.App.Allocations.Reconcile(ctx, node, hello(true, nil, ended.ID.String(), next.ID.String())); err != nil {
		t.Fatal(err)
	}
	if w.heldGPUs(t, ended.ID) != 0 || w.heldGPUs(t, next.ID) != 1 || w.cleanupTask(t, ended.ID) == "" {
		t.Fatalf("ended holds %d, next %d, cleanup task %q", w.heldGPUs(t, ended.ID), w.heldGPUs(t, next.ID), w.cleanupTask(t, ended.ID))
	}
}
