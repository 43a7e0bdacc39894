package allocations_test

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// OnTaskResult says "recorded" (nil: the fabric acknowledges the result to the agent)
// for a committed report, its repeat, and a report refused for good; a report that could
// not be recorded (here: the request's context already ended, as when the database is
// unreachable) is not acknowledged, so the agent sends it again.
func TestOnTaskResultAcknowledgesOnlyWhatIsSettled(t *testing.T) {
	w := newWorld(t, 16)
	node := w.node(t, "n", 2)
	a := w.mustCreate(t, "train")
	prov := w.task(t, a.ID, allocations.TaskProvision)
	ok := func(id string) *fabricv1.TaskResult {
		return &fabricv1.TaskResult{TaskId: id, Status: fabricv1.TaskResultStatus_TASK_RESULT_STATUS_SUCCEEDED,
			Result: []byte(`{"host":"10.7.0.1","port":22,"user":"gantry-a1"}`)}
	}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if err := w.App.Allocations.OnTaskResult(gone, node, ok(prov)); err == nil {
		t.Fatal("a report that was not recorded was acknowledged")
	}
	if s := w.status(t, a.ID).Status; s != "requested" {
		t.Fatalf("status %s after the failed recording", s)
	}
	ctx := context.Background()
	for name, r := range map[string]*fabricv1.TaskResult{"first": ok(prov), "repeat": ok(prov), "unknown task": ok(uuid.NewString())} {
		if err := w.App.Allocations.OnTaskResult(ctx, node, r); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	// A release's report on an active allocation does not fit the lifecycle: refused for
	// good, acknowledged.
	bad := &fabricv1.TaskResult{TaskId: prov, Status: fabricv1.TaskResultStatus_TASK_RESULT_STATUS_FAILED, ErrorCode: "x"}
	if err := w.App.Allocations.OnTaskResult(ctx, node, bad); err != nil {
		t.Fatalf("refused report: %v", err)
	}
	if s := w.status(t, a.ID).Status; s != "active" {
		t.Fatalf("status %s", s)
	}
}
