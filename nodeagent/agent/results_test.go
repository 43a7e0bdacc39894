package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/nodeagent/agent"
	"github.com/gantry-gpu/gantry/nodeagent/runtime"
	"github.com/gantry-gpu/gantry/nodeagent/tasks"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

func resultAck(id string) *fabricv1.ControlMessage {
	return &fabricv1.ControlMessage{Msg: &fabricv1.ControlMessage_ResultAck{ResultAck: &fabricv1.TaskResultAck{TaskId: id}}}
}

func resultFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dir, "results"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func echoMux(runs *atomic.Int32) *tasks.Mux {
	mux := tasks.NewMux()
	mux.Handle("test.echo", tasks.ExecutorFunc(func(ctx context.Context, t tasks.Task) tasks.Result {
		runs.Add(1)
		return tasks.Result{Status: tasks.Succeeded, Output: append([]byte("echo:"), t.Payload...)}
	}))
	return mux
}

// A result sent on a tunnel whose far end never acknowledged it (a control plane that
// died before committing it) is kept on disk and sent again on the next tunnel; the
// acknowledgement removes it, and nothing is sent after that.
func TestResultKeptOnDiskUntilAcknowledged(t *testing.T) {
	p := newPeer(t, nil)
	dir := t.TempDir()
	var runs atomic.Int32
	r := startAgent(t, p, fabricnet.ModeTCP, func(o *agent.Options) {
		o.Executor, o.StateDir, o.ResultResend = echoMux(&runs), dir, time.Hour
	})
	p.waitFor("hello", func() bool { return p.ctl != nil })
	p.send(dispatch("t1", "test.echo"))
	p.waitFor("t1 result", func() bool { return len(results(p, "t1")) == 1 })
	if files := resultFiles(t, dir); len(files) != 1 {
		t.Fatalf("result files after the result was sent: %v", files)
	}
	if got := r.a.PendingResults(); len(got) != 1 || got[0] != "t1" {
		t.Fatalf("pending %v", got)
	}

	// The far end goes away without acknowledging: the result comes again.
	p.cut()
	p.waitFor("second hello listing t1, and t1 sent again", func() bool {
		return p.ctls == 2 && len(p.hellos[1].GetActiveTaskIds()) == 1 && p.hellos[1].GetActiveTaskIds()[0] == "t1" &&
			len(results(p, "t1")) == 2
	})
	// A redelivery is a duplicate and runs nothing.
	p.send(dispatch("t1", "test.echo"))
	p.waitFor("duplicate ack", func() bool { return len(acks(p, "t1")) == 2 })
	p.send(resultAck("t1"))
	deadline := time.Now().Add(20 * time.Second)
	for len(r.a.PendingResults()) != 0 || len(resultFiles(t, dir)) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("acknowledged result still pending: %v, files %v", r.a.PendingResults(), resultFiles(t, dir))
		}
		time.Sleep(10 * time.Millisecond)
	}

	// A third tunnel: nothing to send. The flush precedes the tunnel's first heartbeat.
	p.cut()
	var hbBefore int
	p.waitFor("third tunnel", func() bool {
		hbBefore = p.countLocked(isHeartbeat)
		return p.ctls == 3
	})
	p.waitFor("a heartbeat on the third tunnel", func() bool { return p.countLocked(isHeartbeat) > hbBefore })
	p.mu.Lock()
	n, hello := len(results(p, "t1")), p.hellos[2]
	p.mu.Unlock()
	if n > 3 || len(hello.GetActiveTaskIds()) != 0 {
		t.Fatalf("after the acknowledgement: %d results of t1, hello lists %v", n, hello.GetActiveTaskIds())
	}
	if runs.Load() != 1 {
		t.Fatalf("t1 ran %d times", runs.Load())
	}
}

// On a tunnel that stays up, an unacknowledged result is sent again every ResultResend.
func TestUnacknowledgedResultResentPeriodically(t *testing.T) {
	p := newPeer(t, nil)
	var runs atomic.Int32
	startAgent(t, p, fabricnet.ModeTCP, func(o *agent.Options) {
		o.Executor, o.ResultResend = echoMux(&runs), 50*time.Millisecond
	})
	p.waitFor("hello", func() bool { return p.ctl != nil })
	p.send(dispatch("t1", "test.echo"))
	p.waitFor("t1 sent three times on one tunnel", func() bool { return p.ctls == 1 && len(results(p, "t1")) >= 3 })
	p.send(resultAck("t1"))
	var after int
	p.waitFor("heartbeats after the acknowledgement", func() bool {
		if after == 0 {
			after = p.countLocked(isHeartbeat) + 4 // past several resend periods
		}
		return p.countLocked(isHeartbeat) >= after
	})
	p.mu.Lock()
	n := len(results(p, "t1"))
	p.mu.Unlock()
	// Some re-sends may have crossed the acknowledgement; then none.
	p.waitFor("more heartbeats", func() bool { return p.countLocked(isHeartbeat) >= after+4 })
	p.mu.Lock()
	defer p.mu.Unlock()
	if m := len(results(p, "t1")); m != n {
		t.Fatalf("t1 still re-sent after its acknowledgement: %d then %d", n, m)
	}
}

// An agent that restarts (the process killed after the task finished, before the
// control plane acknowledged the result) reloads the result from disk, lists it in its
// Hello, sends it again and answers a redelivery DUPLICATE without running the task.
func TestPendingResultReloadedAfterAgentRestart(t *testing.T) {
	p := newPeer(t, nil)
	dir := t.TempDir()
	var runs atomic.Int32
	first := startAgent(t, p, fabricnet.ModeTCP, func(o *agent.Options) {
		o.Executor, o.StateDir = echoMux(&runs), dir
	})
	p.waitFor("hello", func() bool { return p.ctl != nil })
	p.send(dispatch("t1", "test.echo"))
	p.waitFor("t1 result", func() bool { return len(results(p, "t1")) == 1 })
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}

	second := startAgent(t, p, fabricnet.ModeTCP, func(o *agent.Options) {
		o.Executor, o.StateDir = echoMux(&runs), dir
		o.Workloads = func() []runtime.Held { return []runtime.Held{{AllocationID: "a1", Phase: "active"}} }
	})
	if got := second.a.PendingResults(); len(got) != 1 || got[0] != "t1" {
		t.Fatalf("reloaded %v", got)
	}
	p.waitFor("the restarted agent's hello lists t1 and sends its result", func() bool {
		h := p.hellos[len(p.hellos)-1]
		return len(p.hellos) == 2 && len(h.GetActiveTaskIds()) == 1 && h.GetActiveTaskIds()[0] == "t1" && len(results(p, "t1")) == 2
	})
	p.send(dispatch("t1", "test.echo"))
	p.waitFor("duplicate ack and the result again", func() bool {
		a := acks(p, "t1")
		return len(a) == 2 && a[1].GetStatus() == fabricv1.TaskAckStatus_TASK_ACK_STATUS_DUPLICATE && len(results(p, "t1")) == 3
	})
	p.send(resultAck("t1"))
	deadline := time.Now().Add(20 * time.Second)
	for len(resultFiles(t, dir)) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("acknowledged result still on disk: %v", resultFiles(t, dir))
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.mu.Lock()
	h := p.hellos[1]
	p.mu.Unlock()
	if !h.GetWorkloadsReported() || len(h.GetWorkloads()) != 1 || h.GetWorkloads()[0].GetAllocationId() != "a1" {
		t.Fatalf("hello workloads %v reported %v", h.GetWorkloads(), h.GetWorkloadsReported())
	}
	if runs.Load() != 1 {
		t.Fatalf("t1 ran %d times", runs.Load())
	}
}

// A result file that does not parse (a damaged disk) does not keep the agent from
// starting: it is moved aside under a hidden name, and the valid results beside it are
// still reloaded and sent.
func TestUnreadableResultFileMovedAside(t *testing.T) {
	p := newPeer(t, nil)
	dir := t.TempDir()
	var runs atomic.Int32
	first := startAgent(t, p, fabricnet.ModeTCP, func(o *agent.Options) {
		o.Executor, o.StateDir = echoMux(&runs), dir
	})
	p.waitFor("hello", func() bool { return p.ctl != nil })
	p.send(dispatch("t1", "test.echo"))
	p.waitFor("t1 result", func() bool { return len(results(p, "t1")) == 1 })
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	junk := filepath.Join(dir, "results", "tjunk.pb")
	if err := os.WriteFile(junk, []byte("\xff\xff not a protobuf"), 0o600); err != nil {
		t.Fatal(err)
	}

	second := startAgent(t, p, fabricnet.ModeTCP, func(o *agent.Options) {
		o.Executor, o.StateDir = echoMux(&runs), dir
	})
	if got := second.a.PendingResults(); len(got) != 1 || got[0] != "t1" {
		t.Fatalf("reloaded %v", got)
	}
	if _, err := os.Stat(junk); !os.IsNotExist(err) {
		t.Fatalf("unreadable file still in place: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "results", ".bad-tjunk.pb")); err != nil {
		t.Fatalf("unreadable file not kept aside: %v", err)
	}
	p.waitFor("t1 sent again", func() bool { return len(results(p, "t1")) == 2 })
}
