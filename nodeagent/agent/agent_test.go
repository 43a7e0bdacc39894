package agent_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/nodeagent/agent"
	"github.com/gantry-gpu/gantry/nodeagent/gpu"
	"github.com/gantry-gpu/gantry/nodeagent/tasks"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

type running struct {
	a    *agent.Agent
	mock *gpu.Mock
	stop func() error // cancels Run and returns its result
}

func startAgent(t *testing.T, p *peer, mode fabricnet.Mode, tune func(*agent.Options)) *running {
	t.Helper()
	m, err := gpu.NewMock(gpu.BackendMockH100, gpu.Options{MockSeed: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	o := agent.Options{
		Addr:         p.addr(),
		Transport:    mode,
		TLS:          p.clientTLS(),
		DialOptions:  &fabricnet.DialOptions{QUICFallbackAfter: 300 * time.Millisecond},
		Token:        func() (string, error) { return "gnt_test-token", nil },
		AgentVersion: "test",
		Hostname:     "gpu-test-01",
		Logger:       slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		GPU:          m,
		Backoff:      agent.Backoff{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond},
	}
	if tune != nil {
		tune(&o)
	}
	a, err := agent.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() { res <- a.Run(ctx) }()
	var stopped bool
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-res:
			return err
		case <-time.After(20 * time.Second):
			t.Fatal("agent did not stop")
			return nil
		}
	}
	t.Cleanup(func() { _ = stop() })
	return &running{a: a, mock: m, stop: stop}
}

func isTelemetry(m *fabricv1.AgentMessage) bool { return m.GetTelemetry() != nil }
func isHeartbeat(m *fabricv1.AgentMessage) bool { return m.GetHeartbeat() != nil }
func isInventory(m *fabricv1.AgentMessage) bool { return m.GetInventory() != nil }

func TestHelloHeartbeatsAndTelemetryOverQUIC(t *testing.T) {
	p := newPeer(t, nil)
	r := startAgent(t, p, fabricnet.ModeQUIC, nil)
	p.waitFor("hello, 3 heartbeats, 2 telemetry samples", func() bool {
		return len(p.hellos) == 1 && p.countLocked(isHeartbeat) >= 3 && p.countLocked(isTelemetry) >= 2
	})
	p.mu.Lock()
	h := p.hellos[0]
	p.mu.Unlock()
	if h.GetHostname() != "gpu-test-01" || h.GetAgentVersion() != "test" || h.GetBootId() == "" {
		t.Fatalf("hello = %v", h)
	}
	gpus := h.GetInventory().GetGpus()
	if len(gpus) != 8 {
		t.Fatalf("hello carries %d GPUs", len(gpus))
	}
	for i, g := range gpus {
		if g.GetModel() != "NVIDIA H100 80GB HBM3" || g.GetMemoryBytes() != 80<<30 || !strings.HasPrefix(g.GetUuid(), "GPU-") ||
			g.GetIndex() != uint32(i) || g.GetDriverVersion() != "550.54.15" || g.GetCudaVersion() != "12.4" ||
			g.GetMigMode() != fabricv1.MIGMode_MIG_MODE_DISABLED || g.GetPciBusId() == "" {
			t.Errorf("gpu %d = %v", i, g)
		}
	}
	p.mu.Lock()
	var tel *fabricv1.Telemetry
	var seqs []uint64
	for _, m := range p.msgs {
		if tel == nil && m.GetTelemetry() != nil {
			tel = m.GetTelemetry()
		}
		if hb := m.GetHeartbeat(); hb != nil {
			seqs = append(seqs, hb.GetSeq())
		}
	}
	p.mu.Unlock()
	if len(tel.GetGpus()) != 8 || tel.GetGpus()[0].GetUuid() != gpus[0].GetUuid() || !tel.GetGpus()[0].GetHealthy() || tel.GetGpus()[0].GetTemperatureC() != 30 {
		t.Fatalf("telemetry = %v", tel)
	}
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			t.Fatalf("heartbeat seqs %v", seqs)
		}
	}
	st := r.a.Status()
	if !st.Connected || st.Transport != "quic" || st.NodeID != "node-1" || st.Sessions != 1 || st.HeartbeatInterval != 100*time.Millisecond || st.TelemetryInterval != 150*time.Millisecond {
		t.Fatalf("status = %+v", st)
	}
}

func TestInventoryResentOnlyWhenItChanges(t *testing.T) {
	p := newPeer(t, nil)
	r := startAgent(t, p, fabricnet.ModeTCP, nil)
	p.waitFor("3 telemetry samples", func() bool { return p.countLocked(isTelemetry) >= 3 })
	p.mu.Lock()
	n := p.countLocked(isInventory)
	p.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d inventory messages without a change", n)
	}
	r.mock.SetMIG(3, true)
	p.waitFor("inventory after MIG change", func() bool { return p.countLocked(isInventory) == 1 })
	p.waitFor("3 more telemetry samples", func() bool { return p.countLocked(isTelemetry) >= 6 })
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := p.countLocked(isInventory); n != 1 {
		t.Fatalf("%d inventory messages for one change", n)
	}
	for _, m := range p.msgs {
		if inv := m.GetInventory(); inv != nil && inv.GetGpus()[3].GetMigMode() != fabricv1.MIGMode_MIG_MODE_ENABLED {
			t.Fatalf("inventory = %v", inv)
		}
	}
}

func TestServerChangesHeartbeatInterval(t *testing.T) {
	p := newPeer(t, nil)
	p.hb = &fabricv1.HeartbeatConfig{Interval: durationpb.New(time.Hour), TelemetryInterval: durationpb.New(time.Hour)}
	r := startAgent(t, p, fabricnet.ModeTCP, nil)
	p.waitFor("hello", func() bool { return len(p.hellos) == 1 && p.ctl != nil && r.a.Status().Connected })
	if st := r.a.Status(); st.HeartbeatInterval != 10*time.Minute { // clamped
		t.Fatalf("status %+v", st)
	}
	p.send(&fabricv1.ControlMessage{Msg: &fabricv1.ControlMessage_HeartbeatConfig{HeartbeatConfig: &fabricv1.HeartbeatConfig{Interval: durationpb.New(50 * time.Millisecond)}}})
	p.waitFor("heartbeats at the new interval", func() bool { return p.countLocked(isHeartbeat) >= 3 })
}

func dispatch(id, kind string) *fabricv1.ControlMessage {
	return &fabricv1.ControlMessage{Msg: &fabricv1.ControlMessage_Task{Task: &fabricv1.TaskDispatch{TaskId: id, Kind: kind, Payload: []byte(`{"x":1}`), Attempt: 1}}}
}

func acks(p *peer, id string) []*fabricv1.TaskAck {
	var out []*fabricv1.TaskAck
	for _, m := range p.msgs {
		if a := m.GetTaskAck(); a != nil && a.GetTaskId() == id {
			out = append(out, a)
		}
	}
	return out
}

func results(p *peer, id string) []*fabricv1.TaskResult {
	var out []*fabricv1.TaskResult
	for _, m := range p.msgs {
		if r := m.GetTaskResult(); r != nil && r.GetTaskId() == id {
			out = append(out, r)
		}
	}
	return out
}

func TestTaskDispatchRunsOncePerID(t *testing.T) {
	p := newPeer(t, nil)
	var runs atomic.Int32
	mux := tasks.NewMux()
	mux.Handle("test.echo", tasks.ExecutorFunc(func(ctx context.Context, t tasks.Task) tasks.Result {
		runs.Add(1)
		return tasks.Result{Status: tasks.Succeeded, Output: append([]byte("echo:"), t.Payload...)}
	}))
	mux.Handle("test.fail", tasks.ExecutorFunc(func(ctx context.Context, t tasks.Task) tasks.Result {
		return tasks.Fail("gpu_unavailable", errors.New("gpu 3 is gone"))
	}))
	r := startAgent(t, p, fabricnet.ModeQUIC, func(o *agent.Options) { o.Executor = mux })
	p.waitFor("hello", func() bool { return p.ctl != nil })

	p.send(dispatch("t1", "test.echo"))
	p.waitFor("t1 ack and result", func() bool { return len(acks(p, "t1")) == 1 && len(results(p, "t1")) == 1 })
	p.send(dispatch("t1", "test.echo")) // redelivery
	p.waitFor("t1 duplicate ack and the result again", func() bool { return len(acks(p, "t1")) == 2 && len(results(p, "t1")) == 2 })
	p.send(dispatch("t2", "test.fail"))
	p.send(dispatch("t3", "test.nope"))
	past := dispatch("t4", "test.echo")
	past.GetTask().Deadline = timestamppb.New(time.Now().Add(-time.Minute))
	p.send(past)
	p.send(dispatch("", "test.echo"))
	p.waitFor("t2 result, t3 and t4 rejected, empty id rejected", func() bool {
		return len(results(p, "t2")) == 1 && len(acks(p, "t3")) == 1 && len(acks(p, "t4")) == 1 && len(acks(p, "")) == 1
	})

	p.mu.Lock()
	defer p.mu.Unlock()
	a1 := acks(p, "t1")
	if a1[0].GetStatus() != fabricv1.TaskAckStatus_TASK_ACK_STATUS_ACCEPTED || a1[1].GetStatus() != fabricv1.TaskAckStatus_TASK_ACK_STATUS_DUPLICATE {
		t.Fatalf("t1 acks %v", a1)
	}
	for _, res := range results(p, "t1") {
		if res.GetStatus() != fabricv1.TaskResultStatus_TASK_RESULT_STATUS_SUCCEEDED || string(res.GetResult()) != `echo:{"x":1}` {
			t.Fatalf("t1 result %v", res)
		}
	}
	if runs.Load() != 1 || r.a.Executions() != 2 { // t1 once, t2 once
		t.Fatalf("echo ran %d times, executor %d", runs.Load(), r.a.Executions())
	}
	if res := results(p, "t2")[0]; res.GetStatus() != fabricv1.TaskResultStatus_TASK_RESULT_STATUS_FAILED || res.GetErrorCode() != "gpu_unavailable" {
		t.Fatalf("t2 result %v", res)
	}
	for id, code := range map[string]string{"t3": agent.AckUnsupportedKind, "t4": agent.AckDeadlineExceeded, "": agent.AckInvalidTask} {
		a := acks(p, id)[0]
		if a.GetStatus() != fabricv1.TaskAckStatus_TASK_ACK_STATUS_REJECTED || a.GetErrorCode() != code {
			t.Fatalf("%q ack %v", id, a)
		}
		if len(results(p, id)) != 0 {
			t.Fatalf("%q: rejected task has a result", id)
		}
	}
}

func TestTaskSurvivesReconnectAndResultIsReportedOnNextTunnel(t *testing.T) {
	p := newPeer(t, nil)
	release := make(chan struct{})
	var runs atomic.Int32
	mux := tasks.NewMux()
	mux.Handle("test.slow", tasks.ExecutorFunc(func(ctx context.Context, t tasks.Task) tasks.Result {
		runs.Add(1)
		<-release
		return tasks.Result{Status: tasks.Succeeded}
	}))
	r := startAgent(t, p, fabricnet.ModeTCP, func(o *agent.Options) { o.Executor = mux })
	p.waitFor("hello", func() bool { return p.ctl != nil })
	p.send(dispatch("slow", "test.slow"))
	p.waitFor("accepted", func() bool { return len(acks(p, "slow")) == 1 })
	p.cut()
	p.waitFor("second hello listing the running task", func() bool {
		return p.ctls == 2 && len(p.hellos[1].GetActiveTaskIds()) == 1 && p.hellos[1].GetActiveTaskIds()[0] == "slow"
	})
	p.send(dispatch("slow", "test.slow")) // redelivered after the reconnect
	p.waitFor("duplicate ack", func() bool { return len(acks(p, "slow")) == 2 })
	close(release)
	p.waitFor("result on the new tunnel", func() bool { return len(results(p, "slow")) == 1 })
	if runs.Load() != 1 || r.a.Status().Sessions != 2 {
		t.Fatalf("runs %d status %+v", runs.Load(), r.a.Status())
	}
}

func TestReconnectsAfterCut(t *testing.T) {
	p := newPeer(t, nil)
	r := startAgent(t, p, fabricnet.ModeQUIC, nil)
	p.waitFor("first tunnel", func() bool { return len(p.hellos) == 1 && r.a.Status().Sessions == 1 })
	boot := p.hellos[0].GetBootId()
	for i := 2; i <= 3; i++ {
		p.cut()
		p.waitFor("tunnel after cut", func() bool { return r.a.Status().Sessions == i && r.a.Status().Connected })
	}
	p.waitFor("status", func() bool { return r.a.Status().Connected })
	st := r.a.Status()
	if st.Sessions != 3 || st.Attempts != 0 {
		t.Fatalf("status %+v", st)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hellos[2].GetBootId() != boot {
		t.Fatal("boot id changed without a restart")
	}
}

// A tunnel the control plane closed (a graceful stop closes every agent's at once) is
// followed by a reconnect spread over Backoff.Spread, not the 250-500 ms of Delay(0):
// the whole fleet learnt of it at the same moment.
func TestSpreadsReconnectWhenTheControlPlaneClosesTheTunnel(t *testing.T) {
	p := newPeer(t, nil)
	delays := make(chan time.Duration, 16)
	r := startAgent(t, p, fabricnet.ModeQUIC, func(o *agent.Options) {
		o.Backoff = agent.Backoff{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond,
			Spread: 300 * time.Millisecond, Rand: func() float64 { return 0.5 }}
		o.OnRetry = func(attempt int, d time.Duration, _ error) {
			if attempt == 0 {
				select {
				case delays <- d:
				default:
				}
			}
		}
	})
	p.waitFor("first tunnel", func() bool { return r.a.Status().Sessions == 1 })
	p.cut()
	select {
	case d := <-delays:
		if d != 150*time.Millisecond { // half the spread; Delay(0) would be 15 ms
			t.Fatalf("reconnect delay after the control plane closed the tunnel = %v, want 150ms", d)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no reconnect attempt after the cut")
	}
	p.waitFor("tunnel after the cut", func() bool { return r.a.Status().Sessions == 2 && r.a.Status().Connected })
}

func TestFallsBackToTCPWhenUDPIsSilent(t *testing.T) {
	p := newPeer(t, &fabricnet.ListenOptions{DisableUDP: true})
	r := startAgent(t, p, fabricnet.ModeAuto, nil)
	p.waitFor("hello", func() bool { return len(p.hellos) == 1 })
	p.waitFor("status", func() bool { return r.a.Status().Connected })
	if st := r.a.Status(); st.Transport != "tcp" {
		t.Fatalf("transport %q", st.Transport)
	}
}

func TestAutoPrefersQUIC(t *testing.T) {
	p := newPeer(t, nil)
	r := startAgent(t, p, fabricnet.ModeAuto, nil)
	p.waitFor("status", func() bool { return r.a.Status().Connected })
	if st := r.a.Status(); st.Transport != "quic" {
		t.Fatalf("transport %q", st.Transport)
	}
}

func TestRefusedTokenKeepsRetryingAndPicksUpANewToken(t *testing.T) {
	p := newPeer(t, nil)
	var tok atomic.Value
	tok.Store("gnt_wrong")
	r := startAgent(t, p, fabricnet.ModeTCP, func(o *agent.Options) {
		o.Token = func() (string, error) { return tok.Load().(string), nil }
		o.Backoff = agent.Backoff{Min: 10 * time.Millisecond, Max: 50 * time.Millisecond}
	})
	p.waitFor("two refusals", func() bool { return p.authFail >= 2 })
	if st := r.a.Status(); st.Connected || !strings.Contains(st.LastError, "refused") {
		t.Fatalf("status %+v", st)
	}
	tok.Store("gnt_test-token") // re-enrolled: the token file was replaced
	p.waitFor("hello", func() bool { return len(p.hellos) == 1 })
}

func TestCleanShutdown(t *testing.T) {
	p := newPeer(t, nil)
	r := startAgent(t, p, fabricnet.ModeQUIC, nil)
	p.waitFor("hello", func() bool { return p.ctlDone != nil })
	p.mu.Lock()
	done := p.ctlDone
	p.mu.Unlock()
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done: // the control stream ended on the server side
	case <-time.After(20 * time.Second):
		t.Fatal("server did not see the tunnel end")
	}
	if st := r.a.Status(); st.Connected {
		t.Fatalf("status %+v", st)
	}
}

func TestShutdownWhileDisconnected(t *testing.T) {
	p := newPeer(t, nil)
	_ = p.ln.Close() // nothing answers
	r := startAgent(t, p, fabricnet.ModeTCP, nil)
	// Stop once the agent has tried and failed at least once (a wait for that, not a
	// guess at how long the first dial takes).
	p.waitFor("a failed connection attempt", func() bool {
		st := r.a.Status()
		return st.Attempts > 0 && st.LastError != ""
	})
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if st := r.a.Status(); st.Connected || st.Attempts == 0 || st.LastError == "" {
		t.Fatalf("status %+v", st)
	}
}

func TestRawStreamsRefusedWithoutHandler(t *testing.T) {
	p := newPeer(t, nil)
	startAgent(t, p, fabricnet.ModeQUIC, nil)
	p.waitFor("session", func() bool { return len(p.sessions) == 1 && p.ctl != nil })
	p.mu.Lock()
	s := p.sessions[0]
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := fabricnet.OpenRaw(ctx, s, &fabricv1.StreamPreamble{Kind: fabricv1.StreamKind_STREAM_KIND_TERMINAL, StreamId: "x"})
	var refused *fabricnet.StreamRefusedError
	if !errors.As(err, &refused) || refused.Code != "unsupported_kind" {
		t.Fatalf("err = %v", err)
	}
}

func TestXIDTriggersTelemetryAtOnce(t *testing.T) {
	p := newPeer(t, nil)
	p.hb = &fabricv1.HeartbeatConfig{Interval: durationpb.New(time.Hour), TelemetryInterval: durationpb.New(time.Hour)}
	r := startAgent(t, p, fabricnet.ModeQUIC, nil)
	p.waitFor("first telemetry (sent right after the welcome)", func() bool { return p.countLocked(isTelemetry) == 1 })
	r.mock.InjectXID(2, 79)
	p.waitFor("telemetry carrying the XID long before the hourly tick", func() bool {
		for _, m := range p.msgs {
			if tel := m.GetTelemetry(); tel != nil {
				if g := tel.GetGpus()[2]; len(g.GetXidErrors()) == 1 && g.GetXidErrors()[0] == 79 && !g.GetHealthy() {
					return true
				}
			}
		}
		return false
	})
}
