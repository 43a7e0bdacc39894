package allocations_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/alloctask"
)

// What the provisioning dispatcher asks of allocations (dispatch.go); the dispatcher's
// own tests (internal/provisioning) run the whole way through the stream and the fabric.

func (w *world) dispatchTask(t *testing.T, id uuid.UUID) allocations.DispatchTask {
	t.Helper()
	dt, err := w.App.Allocations.DispatchTask(t.Context(), id)
	if err != nil {
		t.Fatalf("dispatch task %s: %v", id, err)
	}
	return dt
}

func (w *world) eventCount(t *testing.T, id uuid.UUID) int {
	return w.count(t, `SELECT count(*) FROM allocation_events WHERE allocation_id = $1`, id)
}

func TestDispatchTaskAndAcknowledgement(t *testing.T) {
	w := newWorld(t, 16)
	ctx := t.Context()
	node := w.node(t, "n", 2)
	a := w.mustCreate(t, "train")
	taskID := uuid.MustParse(w.task(t, a.ID, allocations.TaskProvision))

	if _, err := w.App.Allocations.DispatchTask(ctx, uuid.New()); !errors.Is(err, allocations.ErrUnknownTask) {
		t.Fatalf("unknown task: %v", err)
	}
	dt := w.dispatchTask(t, taskID)
	if !dt.Pending() || dt.Kind != alloctask.KindProvision || dt.NodeID != node || dt.AllocationID != a.ID ||
		!dt.Deadline.Equal(dt.CreatedAt.Add(allocations.DefaultProvisioningTimeout)) || dt.AllocationStatus != "requested" {
		t.Fatalf("task: %+v", dt)
	}
	p := dt.Payload
	if p.AllocationID != a.ID.String() || p.TenantID != w.Acme.ID.String() || p.ProjectID != w.Acme.DefaultProject.String() ||
		p.User != alloctask.UserName(a.ID.String()) || len(p.GPUs) != 1 || p.GPUs[0] != (alloctask.GPU{UUID: "GPU-n-0", Index: 0}) ||
		len(p.SSHPublicKeys) != 1 || !strings.HasPrefix(p.SSHPublicKeys[0], "ssh-ed25519 ") || p.Validate() != nil {
		t.Fatalf("payload: %+v (%v)", p, p.Validate())
	}

	// An attempt that did not reach the agent is recorded on the task only.
	events := w.eventCount(t, a.ID)
	if err := w.App.Allocations.TaskUndelivered(ctx, taskID, 1, "node_offline: no tunnel"); err != nil {
		t.Fatal(err)
	}
	if dt := w.dispatchTask(t, taskID); dt.Attempts != 1 || !dt.Pending() || w.eventCount(t, a.ID) != events {
		t.Fatalf("after an undelivered attempt: %+v", dt)
	}
	if n := w.count(t, `SELECT count(*) FROM allocation_tasks WHERE task_id = $1 AND last_error = 'node_offline: no tunnel'`, taskID); n != 1 {
		t.Fatal("cause not recorded")
	}

	// The agent's ack: provisioning, once.
	recorded, err := w.App.Allocations.TaskAcknowledged(ctx, taskID, 2)
	if err != nil || !recorded {
		t.Fatalf("ack: %v %v", recorded, err)
	}
	if got := w.status(t, a.ID); got.Status != "provisioning" {
		t.Fatalf("status %s", got.Status)
	}
	if n := w.count(t, `SELECT count(*) FROM allocation_events WHERE allocation_id = $1 AND event = 'provision_started' AND actor_type = 'system'`, a.ID); n != 1 {
		t.Fatalf("provision_started events: %d", n)
	}
	if n := w.count(t, `SELECT count(*) FROM audit_events WHERE action = 'allocation.provision_started' AND target_id = $1`, a.ID.String()); n != 1 {
		t.Fatalf("audit rows: %d", n)
	}
	events = w.eventCount(t, a.ID)
	recorded, err = w.App.Allocations.TaskAcknowledged(ctx, taskID, 3)
	if err != nil || recorded || w.eventCount(t, a.ID) != events {
		t.Fatalf("repeated ack: %v %v", recorded, err)
	}
	if dt := w.dispatchTask(t, taskID); dt.Pending() || dt.Settled != "acknowledged" || dt.Attempts != 2 {
		t.Fatalf("acknowledged task: %+v", dt)
	}
	// Past the ack, neither a timeout nor a refusal applies.
	if done, err := w.App.Allocations.TaskExpired(ctx, taskID, 4); err != nil || done {
		t.Fatalf("expiry of an acknowledged task: %v %v", done, err)
	}
	if done, err := w.App.Allocations.TaskRejected(ctx, taskID, 4, "x", "y"); err != nil || done {
		t.Fatalf("refusal of an acknowledged task: %v %v", done, err)
	}
	if got := w.status(t, a.ID); got.Status != "provisioning" || w.eventCount(t, a.ID) != events {
		t.Fatalf("status %s", got.Status)
	}
}

// The agent's report overtook the dispatcher's recording of its ack: the ack is
// recorded on the task and moves nothing.
func TestAcknowledgementAfterTheReport(t *testing.T) {
	w := newWorld(t, 16)
	node := w.node(t, "n", 1)
	a := w.mustCreate(t, "train")
	taskID := w.task(t, a.ID, allocations.TaskProvision)
	if err := w.report(t, node, taskID, true, `{"host":"h","port":22,"user":"u"}`); err != nil {
		t.Fatal(err)
	}
	events := w.eventCount(t, a.ID)
	recorded, err := w.App.Allocations.TaskAcknowledged(t.Context(), uuid.MustParse(taskID), 1)
	if err != nil || !recorded {
		t.Fatalf("ack: %v %v", recorded, err)
	}
	if got := w.status(t, a.ID); got.Status != "active" || w.eventCount(t, a.ID) != events {
		t.Fatalf("status %s, events %d -> %d", got.Status, events, w.eventCount(t, a.ID))
	}
	if dt := w.dispatchTask(t, uuid.MustParse(taskID)); dt.Settled != "finished" {
		t.Fatalf("settled %q", dt.Settled)
	}
}

// Each kind's expiry: provision → failed, release → release_failed, restart →
// restart_failed, stop → recorded only; each with its reason, the task finished, and
// provisioning.failed / provisioning.release_failed where the seed names them. A second
// expiry writes nothing.
func TestTaskExpiredPerKind(t *testing.T) {
	w := newWorld(t, 16)
	ctx := t.Context()
	node := w.node(t, "n", 4)

	expire := func(t *testing.T, taskID uuid.UUID) {
		t.Helper()
		done, err := w.App.Allocations.TaskExpired(ctx, taskID, 7)
		if err != nil || !done {
			t.Fatalf("expire: %v %v", done, err)
		}
		writes := w.writes(t)
		if done, err := w.App.Allocations.TaskExpired(ctx, taskID, 8); err != nil || done || w.writes(t) != writes {
			t.Fatalf("second expiry: %v %v", done, err)
		}
		if dt := w.dispatchTask(t, taskID); dt.Settled != "finished" && !strings.HasPrefix(dt.Settled, "allocation_") {
			t.Fatalf("settled %q", dt.Settled)
		}
		if n := w.count(t, `SELECT count(*) FROM allocation_tasks WHERE task_id = $1 AND finished_at IS NOT NULL AND attempts = 7 AND last_error LIKE '%_timeout: node did not acknowledge within 10m'`, taskID); n != 1 {
			t.Fatal("task not finished with its reason")
		}
	}
	failedEvents := func(typ string, id uuid.UUID) int {
		return w.count(t, `SELECT count(*) FROM outbox_events WHERE event_type = $1 AND payload->>'allocation_id' = $2`, typ, id.String())
	}

	t.Run("provision", func(t *testing.T) {
		a := w.mustCreate(t, "p")
		expire(t, uuid.MustParse(w.task(t, a.ID, allocations.TaskProvision)))
		got := w.status(t, a.ID)
		if got.Status != "failed" || got.StatusReason == nil || *got.StatusReason != "provisioning_timeout: node did not acknowledge within 10m" {
			t.Fatalf("%+v", got)
		}
		if n := w.count(t, `SELECT count(*) FROM allocation_gpus WHERE allocation_id = $1 AND released_at IS NULL`, a.ID); n != 0 {
			t.Fatalf("GPUs held: %d", n)
		}
		if failedEvents("provisioning.failed", a.ID) != 1 || failedEvents("provisioning.release_failed", a.ID) != 0 {
			t.Fatal("provisioning.failed not emitted once")
		}
	})
	t.Run("release", func(t *testing.T) {
		a := w.mustCreate(t, "r")
		if err := w.report(t, node, w.task(t, a.ID, allocations.TaskProvision), true, `{"host":"h","port":22,"user":"u"}`); err != nil {
			t.Fatal(err)
		}
		rel, _ := w.Alice.ReleaseAllocationWithResponse(ctx, a.ID, &api.ReleaseAllocationParams{XProjectID: w.Acme.DefaultProject})
		if rel.StatusCode() != 200 {
			t.Fatalf("release: %s", rel.Body)
		}
		expire(t, uuid.MustParse(w.task(t, a.ID, allocations.TaskRelease)))
		got := w.status(t, a.ID)
		if got.Status != "release_failed" || got.StatusReason == nil || *got.StatusReason != "release_timeout: node did not acknowledge within 10m" {
			t.Fatalf("%+v", got)
		}
		if w.openUsage(t, a.ID) != 0 || failedEvents("provisioning.release_failed", a.ID) != 1 || failedEvents("provisioning.failed", a.ID) != 0 {
			t.Fatal("billing still open or provisioning.release_failed not emitted once")
		}
	})
	// Restarting and stopped are entered by features of their own; the rows are set up
	// directly so this test covers only what the dispatcher decides.
	inStatus := func(t *testing.T, name, status, kind string) (uuid.UUID, uuid.UUID) {
		t.Helper()
		a := w.mustCreate(t, name)
		taskID := uuid.New()
		if _, err := w.Pool.Exec(ctx, `UPDATE allocations SET status = $2 WHERE id = $1`, a.ID, status); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Pool.Exec(ctx, `INSERT INTO allocation_tasks (task_id, allocation_id, node_id, kind, created_at) VALUES ($1, $2, $3, $4, $5)`,
			taskID, a.ID, node, kind, time.Now()); err != nil {
			t.Fatal(err)
		}
		return a.ID, taskID
	}
	t.Run("restart", func(t *testing.T) {
		id, taskID := inStatus(t, "rs", "restarting", alloctask.KindRestart)
		if dt := w.dispatchTask(t, taskID); !dt.Pending() {
			t.Fatalf("restart task settled: %q", dt.Settled)
		}
		expire(t, taskID)
		if got := w.status(t, id); got.Status != "restart_failed" || *got.StatusReason != "restart_timeout: node did not acknowledge within 10m" {
			t.Fatalf("%+v", got)
		}
	})
	t.Run("stop", func(t *testing.T) {
		id, taskID := inStatus(t, "st", "stopped", alloctask.KindStop)
		events := w.eventCount(t, id)
		expire(t, taskID)
		if got := w.status(t, id); got.Status != "stopped" || w.eventCount(t, id) != events {
			t.Fatalf("a stop expiry moved the allocation: %+v", got)
		}
	})
}

// A task is no longer pending once the allocation left the status it was sent for, or
// a newer task of the allocation replaced it.
func TestDispatchTaskSettledWhenOvertaken(t *testing.T) {
	w := newWorld(t, 16)
	ctx := t.Context()
	node := w.node(t, "n", 1)
	a := w.mustCreate(t, "train")
	prov := uuid.MustParse(w.task(t, a.ID, allocations.TaskProvision))
	rel, _ := w.Alice.ReleaseAllocationWithResponse(ctx, a.ID, &api.ReleaseAllocationParams{XProjectID: w.Acme.DefaultProject})
	if rel.StatusCode() != 200 {
		t.Fatalf("release: %s", rel.Body)
	}
	if dt := w.dispatchTask(t, prov); dt.Settled != "allocation_releasing" {
		t.Fatalf("provision task of a releasing allocation: %q", dt.Settled)
	}
	if done, err := w.App.Allocations.TaskExpired(ctx, prov, 1); err != nil || done {
		t.Fatalf("expiry of an overtaken task: %v %v", done, err)
	}
	first := uuid.MustParse(w.task(t, a.ID, allocations.TaskRelease))
	if dt := w.dispatchTask(t, first); !dt.Pending() {
		t.Fatalf("release task: %q", dt.Settled)
	}
	newer := uuid.New()
	if _, err := w.Pool.Exec(ctx, `INSERT INTO allocation_tasks (task_id, allocation_id, node_id, kind, created_at) VALUES ($1, $2, $3, $4, now() + interval '1 second')`,
		newer, a.ID, node, alloctask.KindRelease); err != nil {
		t.Fatal(err)
	}
	if dt := w.dispatchTask(t, first); dt.Settled != "superseded" {
		t.Fatalf("older release task: %q", dt.Settled)
	}
	if done, err := w.App.Allocations.TaskRejected(ctx, first, 1, "x", "y"); err != nil || done {
		t.Fatalf("refusal of a superseded task: %v %v", done, err)
	}
	if got := w.status(t, a.ID); got.Status != "releasing" {
		t.Fatalf("status %s", got.Status)
	}
}

// The agent's refusal fails the allocation like a failure it reported.
func TestTaskRejectedFailsTheAllocation(t *testing.T) {
	w := newWorld(t, 16)
	w.node(t, "n", 1)
	a := w.mustCreate(t, "train")
	taskID := uuid.MustParse(w.task(t, a.ID, allocations.TaskProvision))
	done, err := w.App.Allocations.TaskRejected(t.Context(), taskID, 1, alloctask.CodeInvalidPayload, "allocation_id is not a lowercase UUID")
	if err != nil || !done {
		t.Fatalf("reject: %v %v", done, err)
	}
	got := w.status(t, a.ID)
	if got.Status != "failed" || *got.StatusReason != "invalid_payload: allocation_id is not a lowercase UUID" {
		t.Fatalf("%+v", got)
	}
	if n := w.count(t, `SELECT count(*) FROM outbox_events WHERE event_type = 'provisioning.failed' AND payload->>'reason_code' = 'invalid_payload'`); n != 1 {
		t.Fatalf("provisioning.failed: %d", n)
	}
	if n := w.count(t, `SELECT count(*) FROM allocation_events WHERE allocation_id = $1 AND event = 'provision_failed' AND actor_type = 'system'`, a.ID); n != 1 {
		t.Fatalf("provision_failed events: %d", n)
	}
}
