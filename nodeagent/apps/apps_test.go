package apps_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/gantry-gpu/gantry/nodeagent/apps"
	"github.com/gantry-gpu/gantry/nodeagent/tasks"
	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// TestStartRunsInTheAllocationAndStops: the app runs with the allocation's environment
// (only its GPUs, its id), the templated command and env, in its instance directory,
// never the agent's environment; starting→running→stopped are three generations; a stop
// ends the process group; a second start of the stopped instance is refused.
func TestStartRunsInTheAllocationAndStops(t *testing.T) {
	t.Setenv("SECRET_OF_THE_AGENT", "hunter2")
	n := newNode(t)
	alloc := n.allocation(2, 5)
	s := spec(t, alloc, "http")
	s.Command = append(s.Command, "--gpus={gpu_ids}", "--uuids={gpu_uuids}", "--count={gpu_count}", "--base={base_path}", "{not_a_var}")
	s.Env["APP_GREETING"] = "hello from {app_instance_id} on {port}"
	s.Env["CUDA_VISIBLE_DEVICES"] = "all" // the version cannot widen the allocation's GPUs
	s.BasePath = "/api/v1/app-proxy/" + s.AppInstanceId + "/"
	res := n.run(apptask.KindStart, s)
	if res.Status != tasks.Succeeded {
		t.Fatalf("start: %+v", res)
	}
	out, err := apptask.DecodeStartResult(res.Output)
	if err != nil || out.GetPort() == 0 {
		t.Fatalf("result %v %v", out, err)
	}
	in := n.waitState(s.AppInstanceId, apptask.StateRunning)
	if in.Generation != 2 || in.Port != int(out.GetPort()) || in.AllocationID != alloc {
		t.Fatalf("running instance %+v", in)
	}
	info := get(t, in.Port, "/info")
	uuids := n.inv.GPUs[2].UUID + "," + n.inv.GPUs[5].UUID
	home := filepath.Join(n.dir, "allocations", alloc, "home")
	for _, want := range []string{
		"args=--gpus=0,1 --uuids=" + uuids + " --count=2 --base=/api/v1/app-proxy/" + s.AppInstanceId + "/ {not_a_var}\n",
		"wd=" + filepath.Join(home, ".gantry", "apps", s.AppInstanceId) + "\n",
		"CUDA_VISIBLE_DEVICES=" + uuids + "\n",
		"GANTRY_ALLOCATION_ID=" + alloc + "\n",
		"GANTRY_APP_INSTANCE_ID=" + s.AppInstanceId + "\n",
		"APP_GREETING=hello from " + s.AppInstanceId + " on " + itoa(in.Port) + "\n",
		"PORT=" + itoa(in.Port) + "\n",
		"SECRET_OF_THE_AGENT=\n",
	} {
		if !strings.Contains(info, want) {
			t.Errorf("/info lacks %q:\n%s", want, info)
		}
	}

	// A redelivered start (new task id, same instance) answers the same port.
	if res := n.run(apptask.KindStart, s); res.Status != tasks.Succeeded {
		t.Fatalf("repeated start: %+v", res)
	} else if o, _ := apptask.DecodeStartResult(res.Output); o.GetPort() != out.GetPort() {
		t.Fatalf("repeated start port %d, want %d", o.GetPort(), out.GetPort())
	}

	pid := in.PID
	if res := n.run(apptask.KindStop, &fabricv1.AppStopTask{AppInstanceId: s.AppInstanceId, AllocationId: alloc, Grace: durationpb.New(2 * time.Second)}); res.Status != tasks.Succeeded {
		t.Fatalf("stop: %+v", res)
	}
	waitGone(t, pid)
	in, _ = n.sup.Get(s.AppInstanceId)
	if in.State != apptask.StateStopped || in.Reason != apptask.ReasonStopped || in.Generation != 3 {
		t.Fatalf("after stop %+v", in)
	}
	if res := n.run(apptask.KindStart, s); res.Status != tasks.Failed || res.ErrorCode != apptask.CodeInstanceTerminal {
		t.Fatalf("start after stop: %+v", res)
	}
	// A repeated stop succeeds and changes nothing.
	if res := n.run(apptask.KindStop, &fabricv1.AppStopTask{AppInstanceId: s.AppInstanceId}); res.Status != tasks.Succeeded {
		t.Fatalf("repeated stop: %+v", res)
	}
	if again, _ := n.sup.Get(s.AppInstanceId); again.Generation != 3 {
		t.Fatalf("repeated stop changed the instance: %+v", again)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestStartRefusals: bad payloads, an allocation that is not live here, too few GPUs,
// a command that does not exist (recorded as failed start_failed), an unknown stop.
func TestStartRefusals(t *testing.T) {
	n := newNode(t)
	alloc := n.allocation(0, 1)

	bad := spec(t, alloc, "http")
	bad.AppInstanceId = "not-a-uuid"
	if res := n.run(apptask.KindStart, bad); res.ErrorCode != apptask.CodeInvalidPayload {
		t.Fatalf("bad id: %+v", res)
	}
	b, _ := apptask.Encode(spec(t, alloc, "http"))
	if res := n.mux.Execute(context.Background(), tasks.Task{ID: "x", Kind: apptask.KindStart, Payload: b, ContentType: "application/json"}); res.ErrorCode != apptask.CodeInvalidPayload {
		t.Fatalf("json content type: %+v", res)
	}
	if res := n.mux.Execute(context.Background(), tasks.Task{ID: "y", Kind: apptask.KindStart, Payload: []byte{0xff, 0xff}, ContentType: apptask.ContentType}); res.ErrorCode != apptask.CodeInvalidPayload {
		t.Fatalf("garbage payload: %+v", res)
	}
	if res := n.run(apptask.KindStart, spec(t, uuid.NewString(), "http")); res.ErrorCode != apptask.CodeAllocationNotActive {
		t.Fatalf("unknown allocation: %+v", res)
	}
	few := spec(t, alloc, "http")
	few.MinGpus = 3
	if res := n.run(apptask.KindStart, few); res.ErrorCode != apptask.CodeInsufficientGPUs {
		t.Fatalf("min_gpus 3 on 2: %+v", res)
	}
	enough := spec(t, alloc, "http")
	enough.MinGpus = 2
	if res := n.run(apptask.KindStart, enough); res.Status != tasks.Succeeded {
		t.Fatalf("min_gpus 2 on 2: %+v", res)
	}
	if len(n.sup.Instances()) != 1 {
		t.Fatalf("refused starts left instances: %+v", n.sup.Instances())
	}

	missing := spec(t, alloc, "http")
	missing.Command = []string{"/nonexistent/app-binary"}
	if res := n.run(apptask.KindStart, missing); res.ErrorCode != apptask.CodeStartFailed {
		t.Fatalf("missing binary: %+v", res)
	}
	if in, _ := n.sup.Get(missing.AppInstanceId); in.State != apptask.StateFailed || in.Reason != apptask.ReasonStartFailed || in.Generation != 1 {
		t.Fatalf("missing binary recorded as %+v", in)
	}

	other := n.allocation(3)
	moved := spec(t, other, "http")
	moved.AppInstanceId = enough.AppInstanceId
	if res := n.run(apptask.KindStart, moved); res.ErrorCode != apptask.CodeAllocationMismatch {
		t.Fatalf("same instance, other allocation: %+v", res)
	}

	ghost := uuid.NewString()
	if res := n.run(apptask.KindStop, &fabricv1.AppStopTask{AppInstanceId: ghost, AllocationId: alloc}); res.Status != tasks.Succeeded {
		t.Fatalf("unknown stop: %+v", res)
	}
	if in, _ := n.sup.Get(ghost); in.State != apptask.StateStopped || in.Reason != apptask.ReasonUnknownInstance {
		t.Fatalf("unknown stop recorded as %+v", in)
	}
}

// TestCrashLoopFails: an app that exits at once is restarted max_restarts times with
// backoff, then failed with reason crash_loop and its last output in the message.
func TestCrashLoopFails(t *testing.T) {
	n := newNode(t)
	s := spec(t, n.allocation(0), "crash")
	s.MaxRestarts = 3
	if res := n.run(apptask.KindStart, s); res.Status != tasks.Succeeded {
		t.Fatalf("start: %+v", res)
	}
	in := n.waitState(s.AppInstanceId, apptask.StateFailed)
	if in.Reason != apptask.ReasonCrashLoop || in.Restarts != 3 || !strings.Contains(in.Message, "exit code 3") || !strings.Contains(in.Message, "boom") {
		t.Fatalf("crash loop: %+v", in)
	}
	// starting (1) → failed (2): the restarts in between are not state changes.
	if in.Generation != 2 {
		t.Fatalf("generation %d, want 2", in.Generation)
	}
	reps := n.sup.Reports()
	if len(reps) != 1 || reps[0].GetState() != apptask.StateFailed || reps[0].GetAppInstance().GetReason() != apptask.ReasonCrashLoop ||
		reps[0].GetAppInstance().GetLastExitCode() != 3 || reps[0].GetAppInstance().GetRestarts() != 3 || reps[0].GetController() != apptask.Controller {
		t.Fatalf("report %v", reps)
	}
}

// TestNeverHealthyFails: an app that never answers its health check is killed and
// failed with reason never_healthy after the startup timeout.
func TestNeverHealthyFails(t *testing.T) {
	n := newNode(t)
	s := spec(t, n.allocation(0), "sleep")
	s.StartupTimeout = durationpb.New(300 * time.Millisecond)
	if res := n.run(apptask.KindStart, s); res.Status != tasks.Succeeded {
		t.Fatalf("start: %+v", res)
	}
	pid := n.waitState(s.AppInstanceId, apptask.StateStarting).PID
	in := n.waitState(s.AppInstanceId, apptask.StateFailed)
	if in.Reason != apptask.ReasonNeverHealthy || !strings.Contains(in.Message, "not healthy within 300ms") {
		t.Fatalf("never healthy: %+v", in)
	}
	waitGone(t, pid)
}

// TestExitAfterHealthyRestartsThroughUnhealthy: an app that was running and exits is
// unhealthy until its restart passes the health check again; a failing health check
// makes it unhealthy and a passing one running, each a new generation.
func TestExitAfterHealthyRestartsThroughUnhealthy(t *testing.T) {
	n := newNode(t)
	s := spec(t, n.allocation(0), "http")
	fail := filepath.Join(t.TempDir(), "fail")
	s.Env["APPTEST_FAIL_FILE"] = fail
	if res := n.run(apptask.KindStart, s); res.Status != tasks.Succeeded {
		t.Fatalf("start: %+v", res)
	}
	in := n.waitState(s.AppInstanceId, apptask.StateRunning)
	first := in.PID
	get(t, in.Port, "/quit")
	waitGone(t, first)
	deadline := time.Now().Add(20 * time.Second)
	for {
		in, _ = n.sup.Get(s.AppInstanceId)
		if in.State == apptask.StateRunning && in.Restarts == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not running again: %+v", in)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// starting 1, running 2, unhealthy 3 (exit), running 4.
	if in.Generation != 4 || in.PID == first {
		t.Fatalf("after restart %+v", in)
	}

	if err := os.WriteFile(fail, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	in = n.waitState(s.AppInstanceId, apptask.StateUnhealthy)
	if in.Generation != 5 || !strings.Contains(in.Message, "health check failed 2 times") {
		t.Fatalf("unhealthy %+v", in)
	}
	if err := os.Remove(fail); err != nil {
		t.Fatal(err)
	}
	if in = n.waitState(s.AppInstanceId, apptask.StateRunning); in.Generation != 6 || in.Restarts != 1 {
		t.Fatalf("healthy again %+v", in)
	}
}

// TestAllocationStopEndsItsInstances: stopping the allocation (the runtime kills its
// processes) leaves the instance stopped with reason allocation_inactive, not
// restarted.
func TestAllocationStopEndsItsInstances(t *testing.T) {
	n := newNode(t)
	alloc := n.allocation(0)
	s := spec(t, alloc, "http")
	if res := n.run(apptask.KindStart, s); res.Status != tasks.Succeeded {
		t.Fatalf("start: %+v", res)
	}
	pid := n.waitState(s.AppInstanceId, apptask.StateRunning).PID
	n.stopAllocation(alloc)
	in := n.waitState(s.AppInstanceId, apptask.StateStopped)
	if in.Reason != apptask.ReasonAllocationInactive || in.Restarts != 0 {
		t.Fatalf("after allocation stop %+v", in)
	}
	waitGone(t, pid)
	if res := n.run(apptask.KindStart, spec(t, alloc, "http")); res.ErrorCode != apptask.CodeAllocationNotActive {
		t.Fatalf("start in a stopped allocation: %+v", res)
	}
}

// TestAgentRestartAdoptsRunningApp: a new supervisor over the same state directory
// adopts the still-running process (same pid, same state and generation: nothing to
// report as a change), and stops it; one whose process died meanwhile is restarted.
func TestAgentRestartAdoptsRunningApp(t *testing.T) {
	n := newNode(t)
	alloc := n.allocation(0)
	kept, died := spec(t, alloc, "http"), spec(t, alloc, "http")
	for _, s := range []*fabricv1.AppStartTask{kept, died} {
		if res := n.run(apptask.KindStart, s); res.Status != tasks.Succeeded {
			t.Fatalf("start: %+v", res)
		}
	}
	before := n.waitState(kept.AppInstanceId, apptask.StateRunning)
	diedBefore := n.waitState(died.AppInstanceId, apptask.StateRunning)

	n.cancel()
	n.sup.Wait()
	get(t, diedBefore.Port, "/quit") // dies while no agent watches
	waitGone(t, diedBefore.PID)
	n.start()

	after, ok := n.sup.Get(kept.AppInstanceId)
	if !ok || after.PID != before.PID || after.State != apptask.StateRunning || after.Generation != before.Generation || after.Port != before.Port {
		t.Fatalf("adopted %+v, before %+v", after, before)
	}
	if body := get(t, after.Port, "/health"); body != "ok" {
		t.Fatalf("adopted app answers %q", body)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		d, _ := n.sup.Get(died.AppInstanceId)
		if d.State == apptask.StateRunning && d.Restarts == 1 {
			if d.Generation != diedBefore.Generation+2 { // unhealthy, running
				t.Fatalf("restarted %+v", d)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("died instance not restarted: %+v", d)
		}
		time.Sleep(20 * time.Millisecond)
	}

	if res := n.run(apptask.KindStop, &fabricv1.AppStopTask{AppInstanceId: kept.AppInstanceId, Grace: durationpb.New(2 * time.Second)}); res.Status != tasks.Succeeded {
		t.Fatalf("stop adopted: %+v", res)
	}
	waitGone(t, before.PID)
	if in, _ := n.sup.Get(kept.AppInstanceId); in.State != apptask.StateStopped {
		t.Fatalf("adopted after stop %+v", in)
	}
	// The stopped record survives another restart as stopped.
	n.restart()
	if in, _ := n.sup.Get(kept.AppInstanceId); in.State != apptask.StateStopped || in.Reason != apptask.ReasonStopped {
		t.Fatalf("stopped after restart %+v", in)
	}
}

// TestAppProxyStream: an APP_PROXY stream reaches the app's port (an HTTP request and a
// 64 MiB response through it); unknown, stopped and wrong-port targets are refused with
// their codes.
func TestAppProxyStream(t *testing.T) {
	n := newNode(t)
	alloc := n.allocation(0)
	s := spec(t, alloc, "http")
	if res := n.run(apptask.KindStart, s); res.Status != tasks.Succeeded {
		t.Fatalf("start: %+v", res)
	}
	in := n.waitState(s.AppInstanceId, apptask.StateRunning)
	streams := apps.Streams{Apps: n.sup}

	open := func(pre *fabricv1.StreamPreamble) (*fabricv1.StreamReply, net.Conn) {
		t.Helper()
		a, b := tcpPair(t)
		go streams.ServeStream(context.Background(), pre, b)
		var rep fabricv1.StreamReply
		if err := fabricnet.ReadFrame(a, &rep); err != nil {
			t.Fatal(err)
		}
		return &rep, a
	}
	pre := &fabricv1.StreamPreamble{Kind: fabricv1.StreamKind_STREAM_KIND_APP_PROXY, StreamId: uuid.NewString(), AppInstanceId: s.AppInstanceId, AllocationId: alloc, TargetPort: uint32(in.Port)}
	rep, c := open(pre)
	if !rep.GetOk() {
		t.Fatalf("refused: %v", rep)
	}
	const size = 64 << 20
	if _, err := c.Write([]byte("GET /bytes?n=" + itoa(size) + " HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	_ = c.Close()
	if err != nil || got != size || resp.StatusCode != 200 {
		t.Fatalf("status %d, %d bytes, err %v", resp.StatusCode, got, err)
	}

	for name, c := range map[string]struct {
		pre  *fabricv1.StreamPreamble
		code string
	}{
		"unknown instance": {&fabricv1.StreamPreamble{Kind: fabricv1.StreamKind_STREAM_KIND_APP_PROXY, AppInstanceId: uuid.NewString()}, apptask.StreamTargetNotFound},
		"other allocation": {&fabricv1.StreamPreamble{Kind: fabricv1.StreamKind_STREAM_KIND_APP_PROXY, AppInstanceId: s.AppInstanceId, AllocationId: uuid.NewString()}, apptask.StreamTargetNotFound},
		"wrong port":       {&fabricv1.StreamPreamble{Kind: fabricv1.StreamKind_STREAM_KIND_APP_PROXY, AppInstanceId: s.AppInstanceId, TargetPort: 1}, apptask.StreamTargetNotFound},
		"terminal kind":    {&fabricv1.StreamPreamble{Kind: fabricv1.StreamKind_STREAM_KIND_TERMINAL, AllocationId: alloc}, "unsupported_kind"},
	} {
		if rep, _ := open(c.pre); rep.GetOk() || rep.GetErrorCode() != c.code {
			t.Errorf("%s: %v, want %s", name, rep, c.code)
		}
	}

	if res := n.run(apptask.KindStop, &fabricv1.AppStopTask{AppInstanceId: s.AppInstanceId, Grace: durationpb.New(time.Second)}); res.Status != tasks.Succeeded {
		t.Fatalf("stop: %+v", res)
	}
	if rep, _ := open(pre); rep.GetOk() || rep.GetErrorCode() != apptask.StreamAppNotRunning {
		t.Fatalf("stopped instance: %v", rep)
	}
}

// tcpPair is two ends of a loopback TCP connection (a stand-in for a fabric stream with
// half close).
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := <-acc
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	return a, b
}

// TestRestoreAfterAllocationStoppedMeanwhile: an allocation stopped while no agent ran
// (the runtime killed the app) leaves the restored instance stopped with reason
// allocation_inactive, not restarted.
func TestRestoreAfterAllocationStoppedMeanwhile(t *testing.T) {
	n := newNode(t)
	alloc := n.allocation(0)
	s := spec(t, alloc, "http")
	if res := n.run(apptask.KindStart, s); res.Status != tasks.Succeeded {
		t.Fatalf("start: %+v", res)
	}
	before := n.waitState(s.AppInstanceId, apptask.StateRunning)
	n.cancel()
	n.sup.Wait()
	n.rt.NotifyInactive(nil) // no agent is there to be told
	n.stopAllocation(alloc)
	waitGone(t, before.PID)
	n.start()
	in := n.waitState(s.AppInstanceId, apptask.StateStopped)
	if in.State != apptask.StateStopped || in.Reason != apptask.ReasonAllocationInactive || in.Restarts != 0 || in.Generation != before.Generation+1 {
		t.Fatalf("restored %+v", in)
	}
}

// TestConcurrentStartsOfOneInstance: starts of the same instance under different task
// ids at once start one process and all answer its port.
func TestConcurrentStartsOfOneInstance(t *testing.T) {
	n := newNode(t)
	s := spec(t, n.allocation(0), "http")
	ports := make(chan uint32, 8)
	for range 8 {
		go func() {
			res := n.run(apptask.KindStart, s)
			out, _ := apptask.DecodeStartResult(res.Output)
			if res.Status != tasks.Succeeded {
				t.Errorf("start: %+v", res)
			}
			ports <- out.GetPort()
		}()
	}
	first := <-ports
	for range 7 {
		if p := <-ports; p != first || p == 0 {
			t.Fatalf("ports %d and %d", first, p)
		}
	}
	in := n.waitState(s.AppInstanceId, apptask.StateRunning)
	if len(n.sup.Instances()) != 1 || in.Restarts != 0 || in.Generation != 2 {
		t.Fatalf("instances %+v", n.sup.Instances())
	}
}
