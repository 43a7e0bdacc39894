package agent_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/gantry-gpu/gantry/nodeagent/agent"
	"github.com/gantry-gpu/gantry/nodeagent/config"
	"github.com/gantry-gpu/gantry/nodeagent/gpu"
	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/alloctask"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

// lastReport is the last controller report received about id (nil if none).
func lastReport(p *peer, id string) *fabricv1.ControllerReport {
	var last *fabricv1.ControllerReport
	for _, m := range p.msgs {
		if r := m.GetControllerReport(); r != nil && r.GetObjectId() == id {
			last = r
		}
	}
	return last
}

// TestRunConfigRunsApps: `gantry-nodeagent run` (RunConfig, process runtime) takes
// app.start in a provisioned allocation, reports the app running, serves APP_PROXY
// streams to it, leaves it running across its own restart (the next run adopts it:
// same pid, same generation) and ends it on app.stop.
func TestRunConfigRunsApps(t *testing.T) {
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		ci.Missing(t, "python3 (Debian python3) runs the test app")
	}
	p := newPeer(t, nil)
	cfg := config.Default()
	cfg.Path = filepath.Join(t.TempDir(), "nodeagent.conf")
	cfg.NodeID, cfg.FabricAddr, cfg.FabricServerName = "0190f6a0-0000-7000-8000-0000000000ab", p.addr(), "localhost"
	cfg.GPUBackend, cfg.Hostname, cfg.Runtime, cfg.Transport = "mock-h100", "gpu-apps", "process", "tcp"
	if err := cfg.WriteToken(p.token); err != nil {
		t.Fatal(err)
	}
	if err := cfg.WriteCA(p.caPEM); err != nil {
		t.Fatal(err)
	}
	if err := config.Save(cfg.Path, cfg); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(cfg.Path, false, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	run := func() func() {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- agent.RunConfig(ctx, cfg, "test-run", slog.New(slog.DiscardHandler)) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}
	stop := run()
	defer func() { stop() }()
	p.waitFor("hello", func() bool { return p.ctl != nil })

	m, err := gpu.NewMock(gpu.BackendMockH100, gpu.Options{MockSeed: cfg.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	inv, _ := m.Inventory(context.Background())
	_ = m.Close()
	allocID := uuid.NewString()
	prov, _ := json.Marshal(alloctask.Payload{AllocationID: allocID, TenantID: uuid.NewString(), ProjectID: uuid.NewString(),
		User: alloctask.UserName(allocID), GPUs: []alloctask.GPU{{UUID: inv.GPUs[3].UUID, Index: 3}}})
	p.send(&fabricv1.ControlMessage{Msg: &fabricv1.ControlMessage_Task{Task: &fabricv1.TaskDispatch{TaskId: "prov", Kind: alloctask.KindProvision, Payload: prov, Attempt: 1}}})
	p.waitFor("provisioned", func() bool {
		r := results(p, "prov")
		return len(r) > 0 && r[0].GetStatus() == fabricv1.TaskResultStatus_TASK_RESULT_STATUS_SUCCEEDED
	})

	id := uuid.NewString()
	start, _ := apptask.Encode(&fabricv1.AppStartTask{
		AppInstanceId: id, AllocationId: allocID, Command: []string{py, "-m", "http.server", "{port}", "--bind", "127.0.0.1", "--directory", "{instance_dir}"},
		HealthCheck: &fabricv1.AppHealthCheck{Type: apptask.HealthHTTP, HttpPath: "/", Interval: durationpb.New(100 * time.Millisecond)},
	})
	p.send(&fabricv1.ControlMessage{Msg: &fabricv1.ControlMessage_Task{Task: &fabricv1.TaskDispatch{TaskId: "start", Kind: apptask.KindStart, Payload: start, ContentType: apptask.ContentType, Attempt: 1}}})
	p.waitFor("running", func() bool { return lastReport(p, id).GetState() == apptask.StateRunning })
	p.mu.Lock()
	rep := lastReport(p, id)
	p.mu.Unlock()
	var pid int
	t.Cleanup(func() {
		if pid > 0 {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
	})
	// The app's pid from its record on disk (the agent keeps one per instance).
	readPID := func() int {
		b, err := os.ReadFile(filepath.Join(cfg.Resolve("state"), "apps", id+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var rec struct {
			PID int `json:"pid"`
		}
		_ = json.Unmarshal(b, &rec)
		return rec.PID
	}
	pid = readPID()
	if rep.GetGeneration() != 2 || pid == 0 {
		t.Fatalf("running report %v, pid %d", rep, pid)
	}

	get := func() string {
		p.mu.Lock()
		s := p.sessions[len(p.sessions)-1]
		p.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		st, err := fabricnet.OpenRaw(ctx, s, &fabricv1.StreamPreamble{Kind: fabricv1.StreamKind_STREAM_KIND_APP_PROXY, StreamId: "s", AppInstanceId: id, AllocationId: allocID})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		defer st.Close()
		fmt.Fprintf(st, "GET / HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(st), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		return strconv.Itoa(resp.StatusCode) + " " + string(b)
	}
	if got := get(); !strings.HasPrefix(got, "200 ") || !strings.Contains(got, "Directory listing") {
		t.Fatalf("through the stream: %.200s", got)
	}

	// The agent restarts; the app keeps running and is adopted.
	stop()
	if syscall.Kill(pid, 0) != nil {
		t.Fatal("the app did not survive the agent's shutdown")
	}
	n := 0
	p.mu.Lock()
	for _, m := range p.msgs {
		if m.GetControllerReport().GetObjectId() == id {
			n++
		}
	}
	p.mu.Unlock()
	stop = run()
	p.waitFor("a report from the new run", func() bool {
		c := 0
		for _, m := range p.msgs {
			if m.GetControllerReport().GetObjectId() == id {
				c++
			}
		}
		return c > n && p.ctls == 2
	})
	p.mu.Lock()
	rep = lastReport(p, id)
	p.mu.Unlock()
	if rep.GetState() != apptask.StateRunning || rep.GetGeneration() != 2 || readPID() != pid {
		t.Fatalf("after the restart: %v, pid %d (was %d)", rep, readPID(), pid)
	}
	if got := get(); !strings.HasPrefix(got, "200 ") {
		t.Fatalf("through the stream after the restart: %.200s", got)
	}

	stopTask, _ := apptask.Encode(&fabricv1.AppStopTask{AppInstanceId: id, Grace: durationpb.New(2 * time.Second)})
	p.send(&fabricv1.ControlMessage{Msg: &fabricv1.ControlMessage_Task{Task: &fabricv1.TaskDispatch{TaskId: "stop", Kind: apptask.KindStop, Payload: stopTask, ContentType: apptask.ContentType, Attempt: 1}}})
	p.waitFor("stopped", func() bool { return lastReport(p, id).GetState() == apptask.StateStopped })
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(-pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatal("the app outlived app.stop")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
