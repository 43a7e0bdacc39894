package agent_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/gantry-gpu/gantry/nodeagent/agent"
	"github.com/gantry-gpu/gantry/nodeagent/runtime"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/alloctask"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// TestProvisionTaskRunsOnceAcrossRedeliveryAndAgentRestart: a provision dispatched to a
// real agent with the process runtime succeeds with the connection details; redelivered
// to the same agent it is a duplicate and is not run again; redelivered to a new agent
// over the same state directory (the old one's memory of task ids is gone) it finds the
// provisioned allocation and reports the same result. The allocation kinds are what the
// agent supports: anything else is rejected at dispatch.
func TestProvisionTaskRunsOnceAcrossRedeliveryAndAgentRestart(t *testing.T) {
	p := newPeer(t, nil)
	state := t.TempDir()
	var rt *runtime.Runtime
	withRuntime := func(o *agent.Options) {
		var err error
		rt, err = runtime.New(runtime.Options{
			Driver: &runtime.Process{Root: filepath.Join(state, "allocations")}, StateDir: state,
			Inventory: o.GPU, AdvertiseHost: "gpu-test-01", SSHPort: 22, Logger: o.Logger,
		})
		if err != nil {
			t.Fatal(err)
		}
		o.Executor = rt.Mux()
	}
	first := startAgent(t, p, fabricnet.ModeTCP, withRuntime)
	p.waitFor("hello", func() bool { return p.ctl != nil })

	inv, err := first.mock.Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	id := "0190f6a0-0000-7000-8000-0000000000c1"
	body, _ := json.Marshal(alloctask.Payload{
		AllocationID: id, User: alloctask.UserName(id),
		GPUs:          []alloctask.GPU{{UUID: inv.GPUs[2].UUID, Index: 2}},
		SSHPublicKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAgentTest bob@laptop"},
	})
	provision := &fabricv1.ControlMessage{Msg: &fabricv1.ControlMessage_Task{Task: &fabricv1.TaskDispatch{
		TaskId: "task-p1", Kind: alloctask.KindProvision, Payload: body, ContentType: alloctask.ContentType, Attempt: 1,
	}}}
	want := alloctask.ProvisionResult{Host: "gpu-test-01", Port: 22, User: alloctask.UserName(id)}
	checkResult := func(r *fabricv1.TaskResult) {
		t.Helper()
		var got alloctask.ProvisionResult
		if r.GetStatus() != fabricv1.TaskResultStatus_TASK_RESULT_STATUS_SUCCEEDED || json.Unmarshal(r.GetResult(), &got) != nil || got != want {
			t.Fatalf("result %v", r)
		}
	}

	p.send(provision)
	p.waitFor("accepted and result", func() bool { return len(acks(p, "task-p1")) == 1 && len(results(p, "task-p1")) == 1 })
	p.send(provision) // redelivery to the same agent
	p.waitFor("duplicate and the result again", func() bool { return len(acks(p, "task-p1")) == 2 && len(results(p, "task-p1")) == 2 })
	p.send(dispatch("task-x", "allocation.resize"))
	p.waitFor("unknown kind rejected", func() bool { return len(acks(p, "task-x")) == 1 })
	p.mu.Lock()
	a := acks(p, "task-p1")
	if a[0].GetStatus() != fabricv1.TaskAckStatus_TASK_ACK_STATUS_ACCEPTED || a[1].GetStatus() != fabricv1.TaskAckStatus_TASK_ACK_STATUS_DUPLICATE {
		t.Fatalf("acks %v", a)
	}
	for _, r := range results(p, "task-p1") {
		checkResult(r)
	}
	if x := acks(p, "task-x")[0]; x.GetStatus() != fabricv1.TaskAckStatus_TASK_ACK_STATUS_REJECTED || x.GetErrorCode() != agent.AckUnsupportedKind {
		t.Fatalf("resize ack %v", x)
	}
	p.mu.Unlock()
	if first.a.Executions() != 1 {
		t.Fatalf("executor ran %d times", first.a.Executions())
	}
	s1, ok := rt.Session(id)
	if !ok {
		t.Fatal("no session after provision")
	}
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}

	// The agent restarts: a new process, a new Runtime over the same state directory.
	second := startAgent(t, p, fabricnet.ModeTCP, withRuntime)
	p.waitFor("second hello", func() bool { return p.ctls == 2 })
	if s2, ok := rt.Session(id); !ok || s2.Dir != s1.Dir {
		t.Fatalf("session after restart %+v %v", s2, ok)
	}
	p.send(provision)
	p.waitFor("result after the restart", func() bool { return len(results(p, "task-p1")) == 3 })
	p.mu.Lock()
	checkResult(results(p, "task-p1")[2])
	p.mu.Unlock()
	if second.a.Executions() != 1 || rt.Phase(id) != runtime.PhaseActive {
		t.Fatalf("second agent ran %d, phase %q", second.a.Executions(), rt.Phase(id))
	}
}
