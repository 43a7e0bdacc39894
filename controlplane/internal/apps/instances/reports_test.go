package instances_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances/lifecycle"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Seed §6.2 rule 1: 100 identical controller reports are one audit row; the rest is
// telemetry.
func TestHundredIdenticalReportsAreOneAuditRow(t *testing.T) {
	t.Parallel()
	w := newWorld(t, instances.Config{})
	i := w.started("web", "1.0")
	for n := 0; n < 100; n++ {
		if err := w.report(i, "running", 7); err != nil {
			t.Fatalf("report %d: %v", n, err)
		}
	}
	if got := w.audits(instances.ActionControllerReport, i.ID); got != 1 {
		t.Fatalf("%d controller report audit rows, want 1", got)
	}
	if n := w.count(`SELECT count(*) FROM outbox_events WHERE event_type = 'app_instance.running'`); n != 1 {
		t.Fatalf("%d running events", n)
	}
	got := w.get(i.ID)
	if got.State != lifecycle.Running || got.RunningAt == nil || got.LastReportAt == nil || got.ReportGeneration != 7 || got.NotReadySince != nil {
		t.Fatalf("after reports: %+v", got)
	}
	// Telemetry changes (restart count, time) are stored and still not audited.
	w.clk.Advance(time.Minute)
	err := w.svc.ApplyControllerReport(context.Background(), w.nodeID, &fabricv1.ControllerReport{
		Controller: "app_instance", ObjectId: i.ID.String(), State: "running", Generation: 8,
		ObservedAt: timestamppb.New(w.clk.Now()), AppInstance: &fabricv1.AppInstanceStatus{Restarts: 3, Port: uint32(i.Port)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := w.get(i.ID); got.RestartCount != 3 || got.ReportGeneration != 8 || !got.LastReportAt.Equal(w.clk.Now()) {
		t.Fatalf("telemetry: %+v", got)
	}
	if w.audits(instances.ActionControllerReport, i.ID) != 1 {
		t.Fatal("telemetry was audited")
	}
}

// The lifecycle through the agent's reports, the agent restarting while the instance
// runs, and a stop.
func TestLifecycleThroughReports(t *testing.T) {
	t.Parallel()
	w := newWorld(t, instances.Config{})
	i := w.started("web", "1.0")
	ctx := context.Background()
	steps := []struct {
		state string
		want  lifecycle.State
	}{
		{"starting", lifecycle.Starting}, // a repeat of what the node's ack already said
		{"running", lifecycle.Running},
		{"unhealthy", lifecycle.Unhealthy},
		{"running", lifecycle.Running},
		// The agent restarts: it starts the app over, and reports starting, then running.
		{"starting", lifecycle.Starting},
		{"unhealthy", lifecycle.Starting},
		{"running", lifecycle.Running},
	}
	for n, st := range steps {
		if err := w.report(i, st.state, uint64(n+1)); err != nil {
			t.Fatalf("step %d (%s): %v", n, st.state, err)
		}
		if got := w.get(i.ID); got.State != st.want {
			t.Fatalf("step %d (%s): %s, want %s", n, st.state, got.State, st.want)
		}
	}
	// Changes only: running, unhealthy, running, starting, running.
	if got := w.audits(instances.ActionControllerReport, i.ID); got != 5 {
		t.Fatalf("%d report audit rows, want 5", got)
	}
	stopped, err := w.svc.Stop(w.ctx, w.caller, w.proj, i.ID)
	if err != nil || stopped.State != lifecycle.Stopping {
		t.Fatalf("stop: %+v %v", stopped, err)
	}
	if w.count(`SELECT count(*) FROM app_instance_tasks WHERE instance_id = $1 AND kind = 'app.stop'`, i.ID) != 1 {
		t.Fatal("no app.stop task")
	}
	_, err = w.svc.Stop(w.ctx, w.caller, w.proj, i.ID)
	if e := wantCode(t, err, apierr.AppInstanceStateInvalid); e.HTTPStatus() != 409 {
		t.Fatal(e)
	}
	// Health reports while stopping are repeats; stopped completes the stop.
	if err := w.report(i, "running", 20); err != nil {
		t.Fatal(err)
	}
	if err := w.report(i, "stopped", 21); err != nil {
		t.Fatal(err)
	}
	got := w.get(i.ID)
	if got.State != lifecycle.Stopped || got.EndedAt == nil {
		t.Fatalf("after stopped: %+v", got)
	}
	before := w.count(`SELECT count(*) FROM audit_events`)
	err = w.report(i, "running", 22)
	if e := wantCode(t, err, apierr.InvalidRequest); e.Details["reason"] != "app_instance_transition_invalid" {
		t.Fatal(e)
	}
	if w.count(`SELECT count(*) FROM audit_events`) != before {
		t.Fatal("a refused report wrote an audit row")
	}
	_, err = w.svc.Stop(w.ctx, w.caller, w.proj, i.ID)
	wantCode(t, err, apierr.AppInstanceStateInvalid)
	if err := w.svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestReportsThatAreDropped(t *testing.T) {
	t.Parallel()
	w := newWorld(t, instances.Config{})
	i := w.started("web", "1.0")
	ctx := context.Background()
	if _, err := w.svc.ApplyReport(ctx, uuid.Must(uuid.NewV7()), instances.Report{InstanceID: i.ID, State: "running"}); !errors.Is(err, instances.ErrUnknownInstance) {
		t.Fatalf("another node's report: %v", err)
	}
	if _, err := w.svc.ApplyReport(ctx, w.nodeID, instances.Report{InstanceID: uuid.Must(uuid.NewV7()), State: "running"}); !errors.Is(err, instances.ErrUnknownInstance) {
		t.Fatalf("unknown instance: %v", err)
	}
	if err := w.svc.ApplyControllerReport(ctx, w.nodeID, &fabricv1.ControllerReport{Controller: "allocation", ObjectId: i.ID.String(), State: "running"}); !errors.Is(err, instances.ErrUnknownInstance) {
		t.Fatalf("another controller: %v", err)
	}
	if err := w.report(i, "stopping", 1); apierr.CodeOf(err) != apierr.InvalidRequest {
		t.Fatalf("a state agents do not report: %v", err)
	}
	if got := w.get(i.ID); got.State != lifecycle.Starting || w.audits(instances.ActionControllerReport, i.ID) != 0 {
		t.Fatalf("dropped reports changed %+v", got)
	}
}

// An app that never becomes healthy fails with a reason after the health timeout, and
// its process is stopped; one that crash-loops after it ran fails the same way.
func TestHealthTimeout(t *testing.T) {
	t.Parallel()
	w := newWorld(t, instances.Config{HealthTimeout: 5 * time.Minute})
	ctx := context.Background()
	never := w.started("web", "1.0")
	w.clk.Advance(4 * time.Minute)
	if err := w.svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if w.get(never.ID).State != lifecycle.Starting {
		t.Fatal("failed before the timeout")
	}
	w.clk.Advance(2 * time.Minute)
	if err := w.svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	got := w.get(never.ID)
	if got.State != lifecycle.Failed || got.StateReason == nil || !strings.HasPrefix(*got.StateReason, "never_healthy:") {
		t.Fatalf("never healthy: %s %v", got.State, got.StateReason)
	}
	if w.count(`SELECT count(*) FROM app_instance_tasks WHERE instance_id = $1 AND kind = 'app.stop'`, never.ID) != 1 ||
		w.audits("app_instance.health_timeout", never.ID) != 1 {
		t.Fatal("a health timeout stops the process and is audited")
	}

	loop := w.started("web", "1.0")
	if err := w.report(loop, "running", 1); err != nil {
		t.Fatal(err)
	}
	if err := w.report(loop, "unhealthy", 2); err != nil {
		t.Fatal(err)
	}
	// Crash loop: the agent restarts it again and again; it never passes again.
	for n := 0; n < 6; n++ {
		w.clk.Advance(time.Minute)
		state := "starting"
		if n%2 == 1 {
			state = "unhealthy"
		}
		if err := w.report(loop, state, uint64(3+n)); err != nil {
			t.Fatal(err)
		}
		if err := w.svc.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
	}
	got = w.get(loop.ID)
	if got.State != lifecycle.Failed || got.StateReason == nil || !strings.HasPrefix(*got.StateReason, "unhealthy_timeout:") {
		t.Fatalf("crash loop: %s %v", got.State, got.StateReason)
	}

	// The agent gives up on its own: failed with its reason.
	gaveUp := w.started("web", "1.0")
	if _, err := w.svc.ApplyReport(ctx, w.nodeID, instances.Report{InstanceID: gaveUp.ID, State: "failed", Reason: "crash_loop", Message: "exited 1 five times"}); err != nil {
		t.Fatal(err)
	}
	if got := w.get(gaveUp.ID); got.State != lifecycle.Failed || *got.StateReason != "crash_loop: exited 1 five times" {
		t.Fatalf("gave up: %s %v", got.State, got.StateReason)
	}
}

// A requested instance stops at once; the allocation launched for it is released.
func TestStopRequestedReleasesLaunchedAllocation(t *testing.T) {
	t.Parallel()
	w := newWorld(t, instances.Config{})
	i, err := w.launch(instances.LaunchSpec{AppSlug: "web", Version: "1.0", SKU: "h100.1x"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := w.svc.Stop(w.ctx, w.caller, w.proj, i.ID)
	if err != nil || got.State != lifecycle.Stopped {
		t.Fatalf("stop: %+v %v", got, err)
	}
	if len(w.allocs.released) != 1 || w.allocs.released[0] != i.AllocationID {
		t.Fatalf("released %v", w.allocs.released)
	}
	if w.count(`SELECT count(*) FROM app_instance_tasks WHERE instance_id = $1`, i.ID) != 0 {
		t.Fatal("nothing was sent to a node, so nothing is stopped there")
	}
	// A viewer cannot stop; another project cannot see it.
	viewer := w.proj
	viewer.Role = "viewer"
	j := w.mustLaunch("web", "1.0")
	if _, err := w.svc.Stop(w.ctx, w.caller, viewer, j.ID); apierr.CodeOf(err) != apierr.InsufficientPermissions {
		t.Fatalf("viewer: %v", err)
	}
	if _, err := w.svc.Stop(w.ctx, w.caller, w.other, j.ID); apierr.CodeOf(err) != apierr.AppInstanceNotFound {
		t.Fatalf("other project: %v", err)
	}
	// Stopped before the node took its start: the start is settled, never delivered.
	if _, err := w.svc.Stop(w.ctx, w.caller, w.proj, j.ID); err != nil {
		t.Fatal(err)
	}
	if err := w.svc.Reconcile(context.Background()); err != nil || len(w.node.tasks) != 0 {
		t.Fatalf("delivered after stop: %v %v", err, w.node.tasks)
	}
}

func TestDeliveryOfflineThenRejected(t *testing.T) {
	t.Parallel()
	w := newWorld(t, instances.Config{})
	ctx := context.Background()
	i := w.mustLaunch("web", "1.0")
	w.node.offline = true
	for n := 0; n < 3; n++ {
		if err := w.svc.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if w.get(i.ID).State != lifecycle.Requested || w.count(`SELECT attempts FROM app_instance_tasks WHERE instance_id = $1`, i.ID) != 3 {
		t.Fatal("an offline node: the task waits, attempts counted")
	}
	w.node.offline = false
	w.node.ack = &fabricv1.TaskAck{Status: fabricv1.TaskAckStatus_TASK_ACK_STATUS_REJECTED, ErrorCode: "allocation_not_active", Message: "no runtime"}
	if err := w.svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	got := w.get(i.ID)
	if got.State != lifecycle.Failed || *got.StateReason != "start_rejected: allocation_not_active: no runtime" {
		t.Fatalf("rejected: %s %v", got.State, got.StateReason)
	}
	// A task never taken within the task timeout is given up.
	w.node.ack, w.node.offline = nil, true
	j := w.mustLaunch("web", "1.0")
	w.clk.Advance(instances.DefaultTaskTimeout + time.Second)
	if err := w.svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got := w.get(j.ID); got.State != lifecycle.Failed || !strings.HasPrefix(*got.StateReason, "start_timeout") {
		t.Fatalf("timeout: %s %v", got.State, got.StateReason)
	}
}

func TestTaskResults(t *testing.T) {
	t.Parallel()
	w := newWorld(t, instances.Config{})
	ctx := context.Background()
	i := w.started("web", "1.0")
	startID := w.node.tasks[0].TaskId
	if err := w.svc.TaskResult(ctx, uuid.Must(uuid.NewV7()), &fabricv1.TaskResult{TaskId: startID}); !errors.Is(err, instances.ErrUnknownTask) {
		t.Fatalf("another node's result: %v", err)
	}
	if err := w.svc.TaskResult(ctx, w.nodeID, &fabricv1.TaskResult{TaskId: uuid.NewString()}); !errors.Is(err, instances.ErrUnknownTask) {
		t.Fatalf("unknown task: %v", err)
	}
	fail := &fabricv1.TaskResult{TaskId: startID, Status: fabricv1.TaskResultStatus_TASK_RESULT_STATUS_FAILED, ErrorCode: "start_failed", Message: "python3: not found"}
	for n := 0; n < 2; n++ { // a repeated result is harmless
		if err := w.svc.TaskResult(ctx, w.nodeID, fail); err != nil {
			t.Fatal(err)
		}
	}
	if got := w.get(i.ID); got.State != lifecycle.Failed || *got.StateReason != "start_failed: python3: not found" {
		t.Fatalf("failed start: %s %v", got.State, got.StateReason)
	}
	if w.audits(instances.ActionControllerReport, i.ID) != 1 {
		t.Fatal("one audit row for the failed start")
	}
	// A succeeded stop completes a stopping instance.
	j := w.started("web", "1.0")
	if _, err := w.svc.Stop(w.ctx, w.caller, w.proj, j.ID); err != nil {
		t.Fatal(err)
	}
	if err := w.svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	stop := w.node.tasks[len(w.node.tasks)-1]
	if stop.Kind != "app.stop" {
		t.Fatalf("last task %s", stop.Kind)
	}
	if err := w.svc.TaskResult(ctx, w.nodeID, &fabricv1.TaskResult{TaskId: stop.TaskId, Status: fabricv1.TaskResultStatus_TASK_RESULT_STATUS_SUCCEEDED}); err != nil {
		t.Fatal(err)
	}
	if got := w.get(j.ID); got.State != lifecycle.Stopped {
		t.Fatalf("after the stop result: %s", got.State)
	}
}

// Seed §6.2 rule 2: a bootstrap SSH reconcile is audited only when it enqueues a task
// or changes the requested trust.
func TestBootstrapSSHAuditedOnlyOnChange(t *testing.T) {
	t.Parallel()
	w := newWorld(t, instances.Config{})
	ctx := context.Background()
	i := w.mustLaunch("ssh", "1")
	tasks := func() int {
		return w.count(`SELECT count(*) FROM app_instance_tasks WHERE instance_id = $1 AND kind = 'app.bootstrap_ssh'`, i.ID)
	}
	audits := func() int { return w.audits(instances.ActionBootstrapSSH, i.ID) }
	if tasks() != 1 || audits() != 1 {
		t.Fatalf("launch: %d tasks, %d audits", tasks(), audits())
	}
	keys := w.alloc.SshPublicKeys
	for n := 0; n < 10; n++ { // identical while in flight
		if enq, err := w.svc.ReconcileBootstrapSSH(ctx, i.ID, instances.TrustTrusted, keys); err != nil || enq {
			t.Fatalf("identical request %d: %v %v", n, enq, err)
		}
	}
	if tasks() != 1 || audits() != 1 {
		t.Fatalf("identical requests: %d tasks, %d audits", tasks(), audits())
	}
	// Its task fails: the same request enqueues again (audited).
	var taskID string
	if err := w.pool.QueryRow(ctx, `SELECT task_id::text FROM app_instance_tasks WHERE instance_id = $1 AND kind = 'app.bootstrap_ssh'`, i.ID).Scan(&taskID); err != nil {
		t.Fatal(err)
	}
	if err := w.svc.TaskResult(ctx, w.nodeID, &fabricv1.TaskResult{TaskId: taskID, Status: fabricv1.TaskResultStatus_TASK_RESULT_STATUS_FAILED}); err != nil {
		t.Fatal(err)
	}
	if enq, err := w.svc.ReconcileBootstrapSSH(ctx, i.ID, instances.TrustTrusted, keys); err != nil || !enq || tasks() != 2 || audits() != 2 {
		t.Fatalf("after a failed task: %v %v, %d tasks, %d audits", enq, err, tasks(), audits())
	}
	// Another key: the requested trust changes (audited); again: nothing.
	more := append([]string{sshKey(t)}, keys...)
	for n, want := range []bool{true, false, false} {
		enq, err := w.svc.ReconcileBootstrapSSH(ctx, i.ID, instances.TrustTrusted, more)
		if err != nil || enq != want {
			t.Fatalf("changed keys %d: %v %v", n, enq, err)
		}
	}
	// Revoked: a change, once.
	for n, want := range []bool{true, false} {
		enq, err := w.svc.ReconcileBootstrapSSH(ctx, i.ID, instances.TrustRevoked, nil)
		if err != nil || enq != want {
			t.Fatalf("revoke %d: %v %v", n, enq, err)
		}
	}
	if tasks() != 4 || audits() != 4 {
		t.Fatalf("end: %d tasks, %d audits, want 4 and 4", tasks(), audits())
	}
}

func TestAllocationEndedStopsInstances(t *testing.T) {
	t.Parallel()
	w := newWorld(t, instances.Config{})
	i := w.started("web", "1.0")
	if err := w.report(i, "running", 1); err != nil {
		t.Fatal(err)
	}
	w.allocs.set(w.alloc.ID, "releasing")
	if err := w.svc.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := w.get(i.ID)
	if got.State != lifecycle.Stopped || *got.StateReason != "allocation_releasing" || w.audits("app_instance.allocation_ended", i.ID) != 1 {
		t.Fatalf("%s %v", got.State, got.StateReason)
	}
}

// A node that still runs an instance that is over (it ended with its allocation, say)
// gets an app.stop, once while it is pending; the report itself is refused.
func TestOrphanOnTheNodeIsStopped(t *testing.T) {
	t.Parallel()
	w := newWorld(t, instances.Config{})
	i := w.started("web", "1.0")
	if err := w.report(i, "running", 1); err != nil {
		t.Fatal(err)
	}
	w.allocs.set(w.alloc.ID, "stopped")
	if err := w.svc.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	stops := func() int {
		return w.count(`SELECT count(*) FROM app_instance_tasks WHERE instance_id = $1 AND kind = 'app.stop'`, i.ID)
	}
	if w.get(i.ID).State != lifecycle.Stopped || stops() != 0 {
		t.Fatal("allocation ended: stopped, no task (the node ends the allocation's apps)")
	}
	w.node.offline = true // the stop stays pending
	for n := 0; n < 3; n++ {
		if err := w.report(i, "running", 2); apierr.CodeOf(err) != apierr.InvalidRequest {
			t.Fatalf("report on a stopped instance: %v", err)
		}
		if err := w.svc.Reconcile(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if stops() != 1 {
		t.Fatalf("%d app.stop tasks, want 1", stops())
	}
	if err := w.report(i, "stopped", 3); err != nil {
		t.Fatal(err)
	}
}

// An instance that fails releases the allocation launched for it (on the platform's
// account: no user asked), so its GPUs and billing do not outlive the app; an instance
// on an allocation the user brought leaves that allocation alone.
func TestFailedInstanceReleasesItsLaunchedAllocation(t *testing.T) {
	t.Parallel()
	w := newWorld(t, instances.Config{})
	ctx := context.Background()
	i, err := w.launch(instances.LaunchSpec{AppSlug: "web", Version: "1.0", SKU: "h100.1x"})
	if err != nil {
		t.Fatal(err)
	}
	w.allocs.set(i.AllocationID, "active")
	if err := w.svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got := w.get(i.ID); got.State != lifecycle.Starting {
		t.Fatalf("after delivery: %s", got.State)
	}
	if _, err := w.svc.ApplyReport(ctx, w.nodeID, instances.Report{InstanceID: i.ID, State: "failed", Reason: "crash_loop", Message: "exited 1 five times"}); err != nil {
		t.Fatal(err)
	}
	if got := w.get(i.ID); got.State != lifecycle.Failed {
		t.Fatalf("state %s", got.State)
	}
	w.allocs.mu.Lock()
	bySystem, byUser := append([]uuid.UUID(nil), w.allocs.releasedBySystem...), len(w.allocs.released)
	w.allocs.mu.Unlock()
	if len(bySystem) != 1 || bySystem[0] != i.AllocationID || byUser != 0 {
		t.Fatalf("released by the system %v, by a user %d; want the launched allocation once, by the system", bySystem, byUser)
	}

	// On the user's own allocation: the failure leaves it running.
	own := w.started("web", "1.0")
	if _, err := w.svc.ApplyReport(ctx, w.nodeID, instances.Report{InstanceID: own.ID, State: "failed", Reason: "crash_loop", Message: "x"}); err != nil {
		t.Fatal(err)
	}
	w.allocs.mu.Lock()
	defer w.allocs.mu.Unlock()
	if len(w.allocs.releasedBySystem) != 1 {
		t.Fatalf("the user's own allocation was released: %v", w.allocs.releasedBySystem)
	}
}

// An instance the agent alone ends (its process gone with nobody restarting it, no
// DELETE) releases the allocation launched for it on the platform's account, once; the
// DELETE path releases it as the user and the agent's later "stopped" report releases
// nothing more.
func TestAgentAloneStopReleasesLaunchedAllocation(t *testing.T) {
	t.Parallel()
	w := newWorld(t, instances.Config{})
	ctx := context.Background()
	launchRunning := func() instances.Instance {
		i, err := w.launch(instances.LaunchSpec{AppSlug: "web", Version: "1.0", SKU: "h100.1x"})
		if err != nil {
			t.Fatal(err)
		}
		w.allocs.set(i.AllocationID, "active")
		if err := w.svc.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := w.svc.ApplyReport(ctx, w.nodeID, instances.Report{InstanceID: i.ID, State: "running"}); err != nil {
			t.Fatal(err)
		}
		return i
	}
	i := launchRunning()
	if _, err := w.svc.ApplyReport(ctx, w.nodeID, instances.Report{InstanceID: i.ID, State: "stopped", Reason: "stopped", Message: "the process ended"}); err != nil {
		t.Fatal(err)
	}
	if got := w.get(i.ID); !lifecycle.IsFinal(got.State) {
		t.Fatalf("state %s after the agent's stopped report", got.State)
	}
	w.allocs.mu.Lock()
	bySystem, byUser := append([]uuid.UUID(nil), w.allocs.releasedBySystem...), len(w.allocs.released)
	w.allocs.mu.Unlock()
	if len(bySystem) != 1 || bySystem[0] != i.AllocationID || byUser != 0 {
		t.Fatalf("released by the system %v, by a user %d; want the launched allocation once, by the system", bySystem, byUser)
	}

	// DELETE, then the agent's stopped report: the user's release only.
	j := launchRunning()
	if _, err := w.svc.Stop(w.ctx, w.caller, w.proj, j.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := w.svc.ApplyReport(ctx, w.nodeID, instances.Report{InstanceID: j.ID, State: "stopped", Reason: "stopped"}); err != nil {
		t.Fatal(err)
	}
	if got := w.get(j.ID); got.State != lifecycle.Stopped {
		t.Fatalf("state %s after DELETE and the stopped report", got.State)
	}
	w.allocs.mu.Lock()
	defer w.allocs.mu.Unlock()
	if len(w.allocs.releasedBySystem) != 1 || len(w.allocs.released) != 1 || w.allocs.released[0] != j.AllocationID {
		t.Fatalf("released by the system %v, by the user %v", w.allocs.releasedBySystem, w.allocs.released)
	}
}
