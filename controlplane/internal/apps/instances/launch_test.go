package instances_test

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances/lifecycle"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

func TestLaunchOnActiveAllocationStartsIt(t *testing.T) {
	t.Parallel()
	w := newWorld(t, instances.Config{})
	i := w.mustLaunch("web", "1.0")
	if i.State != lifecycle.Requested || i.NodeID != w.nodeID || i.Port != instances.DefaultPortBase || i.AllocationCreated || i.AppName != "Web" {
		t.Fatalf("instance %+v", i)
	}
	if w.audits(instances.ActionCreate, i.ID) != 1 {
		t.Fatal("launch must audit create once")
	}
	var payload []byte
	var ct string
	if err := w.pool.QueryRow(context.Background(), `SELECT payload, content_type FROM app_instance_tasks WHERE instance_id = $1 AND kind = 'app.start'`,
		i.ID).Scan(&payload, &ct); err != nil {
		t.Fatal(err)
	}
	st, err := apptask.DecodeStart(payload)
	if err != nil || ct != apptask.ContentType {
		t.Fatalf("start payload: %v %s", err, ct)
	}
	if st.GetAppInstanceId() != i.ID.String() || st.GetPort() != uint32(i.Port) || st.GetCommand()[3] != "{port}" ||
		st.GetBasePath() != "/api/v1/app-proxy/"+i.ID.String()+"/" || st.GetHealthCheck().GetHttpPath() != "/" || st.GetMinGpus() != 1 {
		t.Fatalf("start payload %v", st)
	}
	// A second instance on the same node gets the next port.
	j := w.mustLaunch("web", "1.0")
	if j.Port != i.Port+1 {
		t.Fatalf("second port %d", j.Port)
	}
	// The reconcile pass delivers both starts; the node takes them: starting.
	if err := w.svc.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(w.node.tasks) != 2 || w.node.tasks[0].Kind != "app.start" || w.node.tasks[0].ContentType != apptask.ContentType ||
		w.node.tasks[0].TaskId == "" || w.node.tasks[0].Attempt != 1 {
		t.Fatalf("dispatched %v", w.node.tasks)
	}
	if w.get(i.ID).State != lifecycle.Starting || w.audits("app_instance.start", i.ID) != 1 {
		t.Fatal("the node took app.start: starting, audited once")
	}
	if w.count(`SELECT count(*) FROM outbox_events WHERE event_type = 'app_instance.starting'`) != 2 {
		t.Fatal("app_instance.starting events")
	}
	// Nothing is sent twice.
	if err := w.svc.Reconcile(context.Background()); err != nil || len(w.node.tasks) != 2 {
		t.Fatalf("second pass: %v, %d tasks", err, len(w.node.tasks))
	}
	pg, err := w.svc.List(context.Background(), w.proj.ID, uuid.Nil, 1)
	if err != nil || len(pg.Items) != 1 || !pg.More || pg.Items[0].ID != i.ID {
		t.Fatalf("list page: %+v %v", pg, err)
	}
	if _, err := w.svc.Get(context.Background(), w.other.ID, i.ID); apierr.CodeOf(err) != apierr.AppInstanceNotFound {
		t.Fatalf("another project's instance: %v", err)
	}
}

// Every refusal of a launch, in the documented order, leaves nothing behind.
func TestLaunchRefusalsPersistNothing(t *testing.T) {
	t.Parallel()
	w := newWorld(t, instances.Config{})
	on := uuid.NullUUID{UUID: w.alloc.ID, Valid: true}
	otherAlloc := w.alloc
	otherAlloc.ID, otherAlloc.ProjectID = uuid.Must(uuid.NewV7()), w.other.ID
	w.allocs.m[otherAlloc.ID] = otherAlloc
	stopped := w.alloc
	stopped.ID, stopped.Status = uuid.Must(uuid.NewV7()), "stopped"
	w.allocs.m[stopped.ID] = stopped
	unentitled := projectctx.Project{ID: w.proj.ID, TenantID: uuid.Must(uuid.NewV7()), Role: projectctx.RoleOwner}
	viewer := w.proj
	viewer.Role = projectctx.RoleViewer
	long := make([]rune, 121)
	for i := range long {
		long[i] = 'n'
	}
	cases := []struct {
		name   string
		proj   projectctx.Project
		spec   instances.LaunchSpec
		code   apierr.Code
		reason string
	}{
		{"blank name", w.proj, instances.LaunchSpec{Name: "  ", AppSlug: "web", Version: "1.0", AllocationID: on}, apierr.ValidationError, "length"},
		{"long name", w.proj, instances.LaunchSpec{Name: string(long), AppSlug: "web", Version: "1.0", AllocationID: on}, apierr.ValidationError, "length"},
		{"bad slug", w.proj, instances.LaunchSpec{AppSlug: "Web!", Version: "1.0", AllocationID: on}, apierr.ValidationError, "pattern"},
		{"one-char slug", w.proj, instances.LaunchSpec{AppSlug: "w", Version: "1.0", AllocationID: on}, apierr.ValidationError, "pattern"},
		{"empty version", w.proj, instances.LaunchSpec{AppSlug: "web", AllocationID: on}, apierr.ValidationError, "length"},
		{"65-char version", w.proj, instances.LaunchSpec{AppSlug: "web", Version: string(long[:65]), AllocationID: on}, apierr.ValidationError, "length"},
		{"neither target", w.proj, instances.LaunchSpec{AppSlug: "web", Version: "1.0"}, apierr.ValidationError, "one_of"},
		{"both targets", w.proj, instances.LaunchSpec{AppSlug: "web", Version: "1.0", AllocationID: on, SKU: "h100.1x"}, apierr.ValidationError, "one_of"},
		{"viewer", viewer, instances.LaunchSpec{AppSlug: "web", Version: "1.0", AllocationID: on}, apierr.InsufficientPermissions, ""},
		{"unknown app", w.proj, instances.LaunchSpec{AppSlug: "nope", Version: "1.0", AllocationID: on}, apierr.AppNotFound, ""},
		{"unknown version", w.proj, instances.LaunchSpec{AppSlug: "web", Version: "2.0", AllocationID: on}, apierr.AppVersionNotFound, ""},
		{"deprecated version", w.proj, instances.LaunchSpec{AppSlug: "web", Version: "0.9", AllocationID: on}, apierr.AppVersionNotFound, ""},
		{"not entitled", unentitled, instances.LaunchSpec{AppSlug: "web", Version: "1.0", AllocationID: on}, apierr.AppNotEntitled, ""},
		{"another project's allocation", w.proj, instances.LaunchSpec{AppSlug: "web", Version: "1.0", AllocationID: uuid.NullUUID{UUID: otherAlloc.ID, Valid: true}}, apierr.AllocationNotFound, ""},
		{"stopped allocation", w.proj, instances.LaunchSpec{AppSlug: "web", Version: "1.0", AllocationID: uuid.NullUUID{UUID: stopped.ID, Valid: true}}, apierr.AllocationNotActive, "status_not_eligible"},
		{"too few GPUs", w.proj, instances.LaunchSpec{AppSlug: "big", Version: "1", AllocationID: on}, apierr.ValidationError, "insufficient_gpus"},
		{"wrong GPU model", w.proj, instances.LaunchSpec{AppSlug: "h200", Version: "1", AllocationID: on}, apierr.ValidationError, "gpu_model_mismatch"},
		{"unknown sku", w.proj, instances.LaunchSpec{AppSlug: "web", Version: "1.0", SKU: "nope"}, apierr.SKUNotFound, ""},
		// The allocation is created in the launch's transaction, then found too small:
		// the allocation row rolls back with everything else.
		{"new allocation too small", w.proj, instances.LaunchSpec{AppSlug: "big", Version: "1", SKU: "h100.2x"}, apierr.ValidationError, "insufficient_gpus"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.spec.Name == "" {
				c.spec.Name = "n"
			}
			_, err := w.svc.Launch(w.ctx, w.caller, c.proj, c.spec)
			e := wantCode(t, err, c.code)
			if c.reason != "" && e.Details["reason"] != c.reason {
				t.Fatalf("reason %v, want %s", e.Details["reason"], c.reason)
			}
		})
	}
	if w.allocs.created != 1 || !w.allocs.sawTx {
		t.Fatalf("the too-small case must have created its allocation in the launch transaction (created %d)", w.allocs.created)
	}
	for _, q := range []string{`SELECT count(*) FROM app_instances`, `SELECT count(*) FROM app_instance_tasks`, `SELECT count(*) FROM allocations`,
		`SELECT count(*) FROM audit_events`, `SELECT count(*) FROM outbox_events`} {
		if n := w.count(q); n != 0 {
			t.Errorf("%s = %d after refusals", q, n)
		}
	}
}

func TestQuotaPerProjectAtItsEdge(t *testing.T) {
	t.Parallel()
	w := newWorld(t, instances.Config{MaxPerProject: 2})
	a := w.mustLaunch("web", "1.0")
	w.mustLaunch("web", "1.0")
	_, err := w.launch(instances.LaunchSpec{AppSlug: "web", Version: "1.0", AllocationID: uuid.NullUUID{UUID: w.alloc.ID, Valid: true}})
	if e := wantCode(t, err, apierr.AppInstanceQuotaExceeded); e.HTTPStatus() != 429 || e.Details["limit"] != 2 {
		t.Fatalf("quota error %+v", e)
	}
	// A stopped instance no longer counts.
	if _, err := w.svc.Stop(w.ctx, w.caller, w.proj, a.ID); err != nil {
		t.Fatal(err)
	}
	w.mustLaunch("web", "1.0")
	// Another project's quota is its own.
	w.alloc.ProjectID, w.alloc.ID = w.other.ID, uuid.Must(uuid.NewV7())
	w.allocs.m[w.alloc.ID] = w.alloc
	if _, err := w.svc.Launch(w.ctx, w.caller, w.other, instances.LaunchSpec{Name: "x", AppSlug: "web", Version: "1.0",
		AllocationID: uuid.NullUUID{UUID: w.alloc.ID, Valid: true}}); err != nil {
		t.Fatalf("other project: %v", err)
	}
}

func TestWholeAllocationVersionIsAlone(t *testing.T) {
	t.Parallel()
	w := newWorld(t, instances.Config{})
	whole := w.mustLaunch("whole", "1")
	_, err := w.launch(instances.LaunchSpec{AppSlug: "web", Version: "1.0", AllocationID: uuid.NullUUID{UUID: w.alloc.ID, Valid: true}})
	if e := wantCode(t, err, apierr.AppInstanceStateInvalid); e.Details["reason"] != "allocation_in_use" {
		t.Fatal(e)
	}
	if _, err := w.svc.Stop(w.ctx, w.caller, w.proj, whole.ID); err != nil {
		t.Fatal(err)
	}
	w.mustLaunch("web", "1.0")
	_, err = w.launch(instances.LaunchSpec{AppSlug: "whole", Version: "1", AllocationID: uuid.NullUUID{UUID: w.alloc.ID, Valid: true}})
	wantCode(t, err, apierr.AppInstanceStateInvalid)
}

// A launch with a SKU creates the allocation and waits as requested; the reconcile pass
// starts the instance once the allocation is active.
func TestLaunchOnNewAllocationStartsWhenActive(t *testing.T) {
	t.Parallel()
	w := newWorld(t, instances.Config{})
	i, err := w.launch(instances.LaunchSpec{AppSlug: "web", Version: "1.0", SKU: "h100.1x"})
	if err != nil {
		t.Fatal(err)
	}
	if i.State != lifecycle.Requested || !i.AllocationCreated || w.count(`SELECT count(*) FROM allocations WHERE id = $1`, i.AllocationID) != 1 {
		t.Fatalf("instance %+v", i)
	}
	if w.count(`SELECT count(*) FROM app_instance_tasks WHERE instance_id = $1`, i.ID) != 0 {
		t.Fatal("nothing goes to the node before the allocation is active")
	}
	ctx := context.Background()
	if err := w.svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if w.get(i.ID).State != lifecycle.Requested {
		t.Fatal("started before its allocation was active")
	}
	w.allocs.set(i.AllocationID, "active")
	if err := w.svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got := w.get(i.ID); got.State != lifecycle.Starting {
		t.Fatalf("after the allocation went active: %s", got.State)
	}
	if len(w.node.tasks) != 1 || w.node.tasks[0].Kind != "app.start" {
		t.Fatalf("dispatched %v", w.node.tasks)
	}
	// The same pass again sends nothing new (the task was acknowledged).
	if err := w.svc.Reconcile(ctx); err != nil || len(w.node.tasks) != 1 {
		t.Fatalf("second pass: %v, %d tasks", err, len(w.node.tasks))
	}
	// An allocation that fails before it was ever active ends a requested instance.
	j, err := w.launch(instances.LaunchSpec{AppSlug: "web", Version: "1.0", SKU: "h100.1x"})
	if err != nil {
		t.Fatal(err)
	}
	w.allocs.set(j.AllocationID, "failed")
	if err := w.svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got := w.get(j.ID); got.State != lifecycle.Stopped || got.StateReason == nil || *got.StateReason != "allocation_failed" {
		t.Fatalf("instance of a failed allocation: %s %v", got.State, got.StateReason)
	}
}

// A version with its own port gets it; one that hard-codes it cannot run twice on a
// node; one that templates it falls back to the node's range.
func TestVersionPorts(t *testing.T) {
	t.Parallel()
	w := newWorld(t, instances.Config{})
	if i := w.mustLaunch("fixed", "1"); i.Port != 8888 {
		t.Fatalf("port %d", i.Port)
	}
	_, err := w.launch(instances.LaunchSpec{AppSlug: "fixed", Version: "1", AllocationID: uuid.NullUUID{UUID: w.alloc.ID, Valid: true}})
	if e := wantCode(t, err, apierr.AppInstanceStateInvalid); e.Details["reason"] != "port_in_use" {
		t.Fatal(e)
	}
}
