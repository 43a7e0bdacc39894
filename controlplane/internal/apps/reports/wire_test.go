package reports_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/reports"
	"github.com/gantry-gpu/gantry/controlplane/internal/fabric"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/nodeagent/agent"
	nodeapps "github.com/gantry-gpu/gantry/nodeagent/apps"
	"github.com/gantry-gpu/gantry/nodeagent/gpu"
	"github.com/gantry-gpu/gantry/nodeagent/runtime"
	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/alloctask"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"github.com/gantry-gpu/gantry/shared/testenv"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

// waitLimit bounds every wait so a broken path fails instead of hanging; nothing
// asserts how long anything took.
const waitLimit = 60 * time.Second

// wire is a control plane's fabric server whose controller reports go through a Router
// to a recorder, and whose task results are recorded.
type wire struct {
	env     *apitest.Env
	srv     *fabric.Server
	router  *reports.Router
	rec     *recorder
	mu      sync.Mutex
	results map[string]*fabricv1.TaskResult
}

func newWire(t *testing.T) *wire {
	t.Helper()
	e := apitest.New(t)
	a := e.App
	w := &wire{env: e, router: reports.New(slog.New(slog.DiscardHandler)), rec: &recorder{}, results: map[string]*fabricv1.TaskResult{}}
	w.router.Handle(apptask.Controller, w.rec)
	js, err := jetstream.New(a.NATS)
	if err != nil {
		t.Fatal(err)
	}
	bucket := a.Config.EventsStream + "_REPORTS_PRESENCE"
	testenv.CleanupKV(t, js, bucket)
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := fabric.New(ctx, fabric.Config{Addr: "127.0.0.1:0", ReplicaID: "reports-test", Bucket: bucket, SubjectPrefix: "test." + testenv.Namespace(t) + ".reports."}, fabric.Deps{
		Pool: a.Pool, SealKey: a.Config.Auth.MasterKey.Derive("gantry/fabric-pki"), NATS: a.NATS, JS: js, Directory: a.Nodes,
		Clock: a.Clock, IDs: a.IDs, Log: slog.New(slog.DiscardHandler),
		OnTaskResult: func(_ context.Context, _ uuid.UUID, r *fabricv1.TaskResult) error {
			w.mu.Lock()
			w.results[r.GetTaskId()] = r
			w.mu.Unlock()
			return nil
		},
		OnControllerReport: w.router.OnControllerReport,
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; srv.Close() })
	wctx, wcancel := context.WithTimeout(ctx, waitLimit)
	defer wcancel()
	if err := srv.WaitPresence(wctx); err != nil {
		t.Fatal(err)
	}
	w.srv = srv
	return w
}

// host is one GPU host: its state directory survives agent restarts.
type host struct {
	nodeID uuid.UUID
	token  string
	dir    string
	gpus   *gpu.Mock
}

func (w *wire) enroll(t *testing.T) *host {
	t.Helper()
	ctx := context.Background()
	a := w.env.App
	n, err := a.Nodes.Create(ctx, nodes.Spec{Name: "gpu-reports", Address: "10.8.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	et, err := a.Nodes.IssueEnrollmentToken(ctx, n.ID)
	if err != nil {
		t.Fatal(err)
	}
	en, err := a.Nodes.Enroll(ctx, et.Token, "gpu-host", "test/1")
	if err != nil {
		t.Fatal(err)
	}
	m, err := gpu.NewMock(gpu.BackendMockH100, gpu.Options{MockSeed: n.ID.String()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return &host{nodeID: n.ID, token: en.NodeToken, dir: t.TempDir(), gpus: m}
}

// runningAgent is one run of gantry-nodeagent on a host, assembled as RunConfig does:
// the process runtime, the app supervisor over the same state directory, reports and
// APP_PROXY streams.
type runningAgent struct {
	a    *agent.Agent
	sup  *nodeapps.Supervisor
	stop func()
}

func (w *wire) startAgent(t *testing.T, h *host) *runningAgent {
	t.Helper()
	rt, err := runtime.New(runtime.Options{Driver: &runtime.Process{Root: h.dir + "/allocations"}, StateDir: h.dir, Inventory: h.gpus,
		AdvertiseHost: "gpu-host", StopGrace: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	sup, err := nodeapps.New(nodeapps.Options{Envs: rt, StateDir: h.dir, ReportInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	mux := rt.Mux()
	sup.Register(mux)
	rt.NotifyInactive(func(id, _ string) { sup.EndAllocation(id) })
	supCtx, stopSup := context.WithCancel(context.Background())
	if err := sup.Restore(supCtx); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(w.srv.CAPEM())
	ag, err := agent.New(agent.Options{
		Addr: w.srv.ListenAddr().String(), Transport: fabricnet.ModeTCP, TLS: &tls.Config{RootCAs: pool},
		Token: func() (string, error) { return h.token, nil }, AgentVersion: "test/1", Hostname: "gpu-host", GPU: h.gpus,
		Executor: mux, StateDir: h.dir, Workloads: rt.Held, Reports: sup, Streams: nodeapps.Streams{Apps: sup},
		Backoff: agent.Backoff{Min: 50 * time.Millisecond, Max: 500 * time.Millisecond}, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = ag.Run(ctx) }()
	var once sync.Once
	r := &runningAgent{a: ag, sup: sup, stop: func() {
		once.Do(func() { cancel(); <-done; stopSup(); sup.Wait() })
	}}
	t.Cleanup(r.stop)
	eventually(t, "the agent connected", func() bool { return ag.Status().Connected })
	return r
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dispatch sends a task through the fabric and waits for its result.
func (w *wire) dispatch(t *testing.T, nodeID uuid.UUID, kind, contentType string, payload []byte) *fabricv1.TaskResult {
	t.Helper()
	id := uuid.NewString()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	ack, err := w.srv.Dispatch(ctx, nodeID, &fabricv1.TaskDispatch{TaskId: id, Kind: kind, Payload: payload, ContentType: contentType, Attempt: 1})
	if err != nil || ack.GetStatus() != fabricv1.TaskAckStatus_TASK_ACK_STATUS_ACCEPTED {
		t.Fatalf("dispatch %s: %v %v", kind, ack, err)
	}
	var res *fabricv1.TaskResult
	eventually(t, kind+" result", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		res = w.results[id]
		return res != nil
	})
	return res
}

// latest is the last report the control plane applied for object, and every state it
// saw for it in order (repeats collapsed).
func (w *wire) latest(object string) (*fabricv1.ControllerReport, []string) {
	var last *fabricv1.ControllerReport
	var states []string
	for _, g := range w.rec.all() {
		if g.rep.GetObjectId() != object {
			continue
		}
		last = g.rep
		if len(states) == 0 || states[len(states)-1] != g.rep.GetState() {
			states = append(states, g.rep.GetState())
		}
	}
	return last, states
}

// TestReportsFromARealAgent drives a real node agent through a real fabric server:
// allocation.provision and app.start go down as tasks, the app (python3's http.server)
// runs in the allocation, its controller reports come up through the Router in order
// (starting then running, generations increasing), an APP_PROXY stream opened by the
// control plane reaches it; the agent restarts while the app runs and the new agent
// adopts the process and reports the same state and generation again (a repeat, not a
// change); app.stop ends it and the report says stopped.
func TestReportsFromARealAgent(t *testing.T) {
	py, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		ci.Missing(t, "python3 (Debian python3) runs the test app")
	}
	w := newWire(t)
	h := w.enroll(t)
	ag := w.startAgent(t, h)

	inv, err := h.gpus.Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	allocID := uuid.NewString()
	prov, _ := json.Marshal(alloctask.Payload{AllocationID: allocID, TenantID: uuid.NewString(), ProjectID: uuid.NewString(),
		User: alloctask.UserName(allocID), GPUs: []alloctask.GPU{{UUID: inv.GPUs[1].UUID, Index: 1}}})
	if res := w.dispatch(t, h.nodeID, alloctask.KindProvision, alloctask.ContentType, prov); res.GetStatus() != fabricv1.TaskResultStatus_TASK_RESULT_STATUS_SUCCEEDED {
		t.Fatalf("provision: %v", res)
	}
	t.Cleanup(func() {
		for _, in := range ag.sup.Instances() {
			if in.PID > 0 {
				_ = syscall.Kill(-in.PID, syscall.SIGKILL)
			}
		}
	})

	instanceID := uuid.NewString()
	start, _ := apptask.Encode(&fabricv1.AppStartTask{
		AppInstanceId: instanceID, AllocationId: allocID, AppSlug: "http-files", Version: "1",
		Command:     []string{py, "-m", "http.server", "{port}", "--bind", "127.0.0.1", "--directory", "{instance_dir}"},
		HealthCheck: &fabricv1.AppHealthCheck{Type: apptask.HealthHTTP, HttpPath: "/", Interval: durationpb.New(100 * time.Millisecond)},
		MinGpus:     1,
	})
	res := w.dispatch(t, h.nodeID, apptask.KindStart, apptask.ContentType, start)
	if res.GetStatus() != fabricv1.TaskResultStatus_TASK_RESULT_STATUS_SUCCEEDED {
		t.Fatalf("app.start: %v", res)
	}
	out, err := apptask.DecodeStartResult(res.GetResult())
	if err != nil || out.GetPort() == 0 {
		t.Fatalf("app.start result %v %v", out, err)
	}
	eventually(t, "a running report", func() bool {
		last, _ := w.latest(instanceID)
		return last.GetState() == apptask.StateRunning
	})
	last, states := w.latest(instanceID)
	if strings.Join(states, ",") != "starting,running" || last.GetGeneration() != 2 || last.GetAppInstance().GetPort() != out.GetPort() ||
		last.GetAppInstance().GetAllocationId() != allocID {
		t.Fatalf("reports: states %v, last %v", states, last)
	}
	for _, g := range w.rec.all() {
		if g.node != h.nodeID {
			t.Fatalf("report attributed to node %s, want %s", g.node, h.nodeID)
		}
	}

	// The control plane's side of the app proxy: a raw stream to the instance.
	get := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		st, err := w.srv.OpenStream(ctx, h.nodeID, &fabricv1.StreamPreamble{Kind: fabricv1.StreamKind_STREAM_KIND_APP_PROXY,
			StreamId: uuid.NewString(), AppInstanceId: instanceID, AllocationId: allocID, TargetPort: out.GetPort()})
		if err != nil {
			t.Fatalf("open app stream: %v", err)
		}
		defer st.Close()
		fmt.Fprintf(st, "GET / HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(st), nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(); code != http.StatusOK {
		t.Fatalf("through the stream: %d", code)
	}

	// The agent restarts while the app runs.
	before, _ := ag.sup.Get(instanceID)
	applied := len(w.rec.all())
	ag.stop()
	ag = w.startAgent(t, h)
	eventually(t, "reports from the new agent", func() bool { return len(w.rec.all()) > applied })
	after, _ := ag.sup.Get(instanceID)
	last, _ = w.latest(instanceID)
	if after.PID != before.PID || last.GetState() != apptask.StateRunning || last.GetGeneration() != 2 {
		t.Fatalf("after the agent restart: pid %d (was %d), last report %v", after.PID, before.PID, last)
	}
	if code := get(); code != http.StatusOK {
		t.Fatalf("through the stream after the restart: %d", code)
	}

	stop, _ := apptask.Encode(&fabricv1.AppStopTask{AppInstanceId: instanceID, AllocationId: allocID, Grace: durationpb.New(2 * time.Second)})
	if res := w.dispatch(t, h.nodeID, apptask.KindStop, apptask.ContentType, stop); res.GetStatus() != fabricv1.TaskResultStatus_TASK_RESULT_STATUS_SUCCEEDED {
		t.Fatalf("app.stop: %v", res)
	}
	eventually(t, "a stopped report", func() bool {
		last, _ := w.latest(instanceID)
		return last.GetState() == apptask.StateStopped
	})
	last, states = w.latest(instanceID)
	if strings.Join(states, ",") != "starting,running,stopped" || last.GetGeneration() != 3 || last.GetAppInstance().GetReason() != apptask.ReasonStopped {
		t.Fatalf("after stop: states %v, last %v", states, last)
	}
	if syscall.Kill(-before.PID, 0) == nil {
		t.Fatalf("the app's process group %d outlived app.stop", before.PID)
	}
	if st := w.router.Stats(); st[reports.OutcomeInvalid] != 0 || st[reports.OutcomeUnknownController] != 0 || st[reports.OutcomeFailed] != 0 {
		t.Fatalf("router stats %v", st)
	}
}
