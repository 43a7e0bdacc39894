package fabric_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/fabric/fabrictest"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// A task result is acknowledged to the agent only once its recorder says it is recorded:
// while recording fails (a database that is down, a control plane that dies before its
// commit) the agent keeps the result and sends it again on its next tunnel; a repeat of
// a recorded result is acknowledged again.
func TestResultAcknowledgedOnlyAfterItIsRecorded(t *testing.T) {
	fx := newFixture(t)
	var mu sync.Mutex
	down := true
	attempts := 0
	var recorded []string
	fx.deps.OnTaskResult = func(ctx context.Context, nodeID uuid.UUID, r *fabricv1.TaskResult) error {
		mu.Lock()
		defer mu.Unlock()
		attempts++
		if down {
			return errors.New("database unavailable")
		}
		recorded = append(recorded, r.GetTaskId())
		return nil
	}
	srv, _ := fx.server(fx.config("a"))
	_, tok := fx.node()
	a, _ := fx.agent(srv, tok, fabricnet.ModeTCP)
	c1 := waitConn(t, a)

	a.AddResult(&fabricv1.TaskResult{TaskId: "t1", Status: fabricv1.TaskResultStatus_TASK_RESULT_STATUS_SUCCEEDED})
	eventually(t, "the recorder tried t1", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return attempts == 1
	})
	// The heartbeat that follows went down the same stream after the result, and its
	// reply would have come after an ack: none came.
	hb := a.Heartbeats()
	eventually(t, "a heartbeat after the result", func() bool { return a.Heartbeats() > hb+1 })
	if got := a.Acked(); len(got) != 0 {
		t.Fatalf("acknowledged although not recorded: %v", got)
	}

	mu.Lock()
	down = false
	mu.Unlock()
	_ = c1.Session.Close("cut")
	waitConn(t, a)
	eventually(t, "t1 recorded and acknowledged on the next tunnel", func() bool {
		return slices.Equal(a.Acked(), []string{"t1"}) && len(a.Unacknowledged()) == 0
	})

	// A duplicate (the acknowledgement lost with a tunnel) is acknowledged again.
	a.AddResult(&fabricv1.TaskResult{TaskId: "t1", Status: fabricv1.TaskResultStatus_TASK_RESULT_STATUS_SUCCEEDED})
	eventually(t, "the duplicate acknowledged", func() bool { return slices.Equal(a.Acked(), []string{"t1", "t1"}) })
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(recorded, []string{"t1", "t1"}) || attempts != 3 {
		t.Fatalf("recorded %v in %d attempts", recorded, attempts)
	}
}

// Every (re)connect hands the agent's Hello — the workloads it holds — to OnHello, the
// allocations feature's reconcile.
func TestHelloIsReconciledOnEveryConnect(t *testing.T) {
	fx := newFixture(t)
	type call struct {
		node      uuid.UUID
		workloads []string
	}
	calls := make(chan call, 4)
	fx.deps.OnHello = func(ctx context.Context, nodeID uuid.UUID, h *fabricv1.Hello) error {
		c := call{node: nodeID}
		for _, w := range h.GetWorkloads() {
			c.workloads = append(c.workloads, w.GetAllocationId()+"/"+w.GetPhase())
		}
		if !h.GetWorkloadsReported() {
			c.workloads = nil
		}
		calls <- c
		return nil
	}
	srv, _ := fx.server(fx.config("a"))
	id, tok := fx.node()
	a, _ := fx.agent(srv, tok, fabricnet.ModeTCP, func(a *fabrictest.Agent) {
		a.Workloads = []*fabricv1.HeldWorkload{{AllocationId: "a1", Phase: "active"}}
	})
	c1 := waitConn(t, a)
	for i := range 2 {
		select {
		case c := <-calls:
			if c.node != id || !slices.Equal(c.workloads, []string{"a1/active"}) {
				t.Fatalf("connect %d: reconciled %+v", i+1, c)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("connect %d: no reconcile", i+1)
		}
		if i == 0 {
			_ = c1.Session.Close("cut")
			waitConn(t, a)
		}
	}
}
