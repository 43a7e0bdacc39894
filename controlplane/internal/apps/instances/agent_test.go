package instances_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/artifacts"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances/lifecycle"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/reports"
	"github.com/gantry-gpu/gantry/controlplane/internal/fabric"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/nodeagent/agent"
	nodeapps "github.com/gantry-gpu/gantry/nodeagent/apps"
	"github.com/gantry-gpu/gantry/nodeagent/gpu"
	"github.com/gantry-gpu/gantry/nodeagent/runtime"
	"github.com/gantry-gpu/gantry/nodeagent/storagemount"
	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/alloctask"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"github.com/gantry-gpu/gantry/shared/ids"
	"github.com/gantry-gpu/gantry/shared/testenv"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

// waitLimit bounds every wait so a broken path fails instead of hanging; nothing
// asserts how long anything took.
const waitLimit = 60 * time.Second

// field is the instances service over a real fabric server and a real node agent (the
// process runtime and the app supervisor of nodeagent/apps over one state directory,
// as gantry-nodeagent assembles them): app.start and app.stop are delivered by the
// service's reconcile pass, and the agent's controller reports and task results come
// back to the service through the reports router.
type field struct {
	env     *apitest.Env
	srv     *fabric.Server
	svc     *instances.Service
	allocs  *allocs
	nodeID  uuid.UUID
	token   string
	dir     string
	gpus    *gpu.Mock
	allocID uuid.UUID
	proj    projectctx.Project
	caller  *principal.Principal
	mu      sync.Mutex
	results map[string]*fabricv1.TaskResult
	applied atomic.Int64
}

func newField(t *testing.T, cfg instances.Config, versions map[string]instances.Version) *field {
	t.Helper()
	e := apitest.New(t)
	a := e.App
	f := &field{env: e, results: map[string]*fabricv1.TaskResult{}, dir: t.TempDir()}
	router := reports.New(slog.New(slog.DiscardHandler))
	router.Handle(apptask.Controller, reports.ApplierFunc(func(ctx context.Context, nodeID uuid.UUID, r *fabricv1.ControllerReport) error {
		f.applied.Add(1)
		return f.svc.ApplyControllerReport(ctx, nodeID, r)
	}))
	js, err := jetstream.New(a.NATS)
	if err != nil {
		t.Fatal(err)
	}
	bucket := a.Config.EventsStream + "_INSTANCES_PRESENCE"
	testenv.CleanupKV(t, js, bucket)
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := fabric.New(ctx, fabric.Config{Addr: "127.0.0.1:0", ReplicaID: "instances-test", Bucket: bucket, SubjectPrefix: "test." + testenv.Namespace(t) + ".instances."}, fabric.Deps{
		Pool: a.Pool, SealKey: a.Config.Auth.MasterKey.Derive("gantry/fabric-pki"), NATS: a.NATS, JS: js, Directory: a.Nodes,
		Clock: a.Clock, IDs: a.IDs, Log: slog.New(slog.DiscardHandler),
		// App task results go to the instances service; the provision this test sends
		// itself is recorded.
		OnTaskResult: func(ctx context.Context, nodeID uuid.UUID, r *fabricv1.TaskResult) error {
			err := f.svc.TaskResult(ctx, nodeID, r)
			if errors.Is(err, instances.ErrUnknownTask) {
				f.mu.Lock()
				f.results[r.GetTaskId()] = r
				f.mu.Unlock()
				return nil
			}
			return err
		},
		OnControllerReport: router.OnControllerReport,
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	// Agents fetch their instances' artifacts over their tunnels (as app.New registers it).
	srv.RegisterService(&fabricv1.AppArtifactFabric_ServiceDesc, &artifacts.FabricServer{Svc: a.Artifacts, NodeOf: fabric.NodeID})
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; srv.Close() })
	wctx, wcancel := context.WithTimeout(ctx, waitLimit)
	defer wcancel()
	if err := srv.WaitPresence(wctx); err != nil {
		t.Fatal(err)
	}
	f.srv = srv

	n, err := a.Nodes.Create(ctx, nodes.Spec{Name: "gpu-apps", Address: "10.8.0.2"})
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
	f.nodeID, f.token = n.ID, en.NodeToken
	if f.gpus, err = gpu.NewMock(gpu.BackendMockH100, gpu.Options{MockSeed: n.ID.String()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.gpus.Close() })

	tenant := uuid.Must(uuid.NewV7())
	f.proj = projectctx.Project{ID: uuid.Must(uuid.NewV7()), TenantID: tenant, Role: projectctx.RoleMember}
	f.caller = &principal.Principal{UserID: uuid.Must(uuid.NewV7())}
	f.allocID = uuid.Must(uuid.NewV7())
	f.allocs = &allocs{m: map[uuid.UUID]allocations.Allocation{f.allocID: {ID: f.allocID, TenantID: tenant, ProjectID: f.proj.ID,
		GpuCount: 1, GpuModel: "NVIDIA H100 80GB HBM3", NodeID: n.ID, Status: "active"}}}
	cat := &catalog{versions: versions, entitled: map[uuid.UUID]bool{tenant: true}}
	// The apps bind real loopback ports on this machine, beside other tests': take
	// ports the kernel says are free rather than the fixed default range.
	cfg.PortBase, cfg.PortCount = freePort(t), 1
	f.svc = instances.New(a.Pool, clock.Real{}, ids.V7{}, cfg, cat, f.allocs, srv, nil)
	f.svc.Artifacts = a.Artifacts
	return f
}

type agentRun struct {
	sup  *nodeapps.Supervisor
	stop func()
}

// startAgent runs one gantry-nodeagent process's worth of parts over the host's state
// directory (it survives restarts).
func (f *field) startAgent(t *testing.T) *agentRun {
	t.Helper()
	rt, err := runtime.New(runtime.Options{Driver: &runtime.Process{Root: f.dir + "/allocations"}, StateDir: f.dir, Inventory: f.gpus,
		AdvertiseHost: "gpu-host", StopGrace: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	conns := storagemount.NewConns()
	sup, err := nodeapps.New(nodeapps.Options{Envs: rt, StateDir: f.dir, ReportInterval: 200 * time.Millisecond,
		Artifacts: nodeapps.FabricArtifacts{Conn: conns.Wait}})
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
	pool.AppendCertsFromPEM(f.srv.CAPEM())
	ag, err := agent.New(agent.Options{
		Addr: f.srv.ListenAddr().String(), Transport: fabricnet.ModeTCP, TLS: &tls.Config{RootCAs: pool},
		Token: func() (string, error) { return f.token, nil }, AgentVersion: "test/1", Hostname: "gpu-host", GPU: f.gpus,
		Executor: mux, StateDir: f.dir, Workloads: rt.Held, Reports: sup, Streams: nodeapps.Streams{Apps: sup}, OnConnection: conns.Set,
		Backoff: agent.Backoff{Min: 50 * time.Millisecond, Max: 500 * time.Millisecond}, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = ag.Run(ctx) }()
	var once sync.Once
	r := &agentRun{sup: sup, stop: func() { once.Do(func() { cancel(); <-done; stopSup(); sup.Wait() }) }}
	t.Cleanup(r.stop)
	wait(t, "the agent connected", func() bool { return ag.Status().Connected })
	t.Cleanup(func() {
		for _, in := range sup.Instances() {
			if in.PID > 0 {
				_ = syscall.Kill(-in.PID, syscall.SIGKILL)
			}
		}
	})
	return r
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func wait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// provision creates the allocation's runtime on the node (allocation.provision, as the
// allocations feature sends it).
func (f *field) provision(t *testing.T) {
	t.Helper()
	inv, err := f.gpus.Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.NewString()
	prov, _ := json.Marshal(alloctask.Payload{AllocationID: f.allocID.String(), TenantID: f.proj.TenantID.String(), ProjectID: f.proj.ID.String(),
		User: alloctask.UserName(f.allocID.String()), GPUs: []alloctask.GPU{{UUID: inv.GPUs[0].UUID, Index: 0}}})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if ack, err := f.srv.Dispatch(ctx, f.nodeID, &fabricv1.TaskDispatch{TaskId: id, Kind: alloctask.KindProvision, Payload: prov,
		ContentType: alloctask.ContentType, Attempt: 1}); err != nil || ack.GetStatus() != fabricv1.TaskAckStatus_TASK_ACK_STATUS_ACCEPTED {
		t.Fatalf("provision: %v %v", ack, err)
	}
	wait(t, "the provision result", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.results[id] != nil
	})
	if r := f.results[id]; r.GetStatus() != fabricv1.TaskResultStatus_TASK_RESULT_STATUS_SUCCEEDED {
		t.Fatalf("provision: %v", r)
	}
}

// until runs the reconcile pass until the instance is in state.
func (f *field) until(t *testing.T, id uuid.UUID, state lifecycle.State) instances.Instance {
	t.Helper()
	var i instances.Instance
	wait(t, "state "+string(state), func() bool {
		if err := f.svc.Reconcile(context.Background()); err != nil {
			t.Logf("reconcile: %v", err)
		}
		var err error
		if i, err = f.svc.Get(context.Background(), f.proj.ID, id); err != nil {
			t.Fatal(err)
		}
		return i.State == state
	})
	return i
}

func (f *field) audits(action string, id uuid.UUID) int {
	var n int
	if err := f.env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM audit_events WHERE action = $1 AND target_id = $2`,
		action, id.String()).Scan(&n); err != nil {
		panic(err)
	}
	return n
}

func python(t *testing.T) string {
	py, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		ci.Missing(t, "python3 (Debian python3) runs the test app")
	}
	return py
}

// The lifecycle through a real node agent's reports: launch → the reconcile pass
// delivers app.start → the agent starts python3's http.server in the allocation and
// reports starting, then running; the agent resends its reports (and restarts while
// the app runs, adopting it) without a single new audit row; DELETE → app.stop → the
// agent stops it → stopped.
func TestLifecycleWithARealAgent(t *testing.T) {
	t.Parallel()
	py := python(t)
	f := newField(t, instances.Config{}, map[string]instances.Version{"files@1": {AppSlug: "files", AppName: "Files", Kind: "app", Version: "1",
		Command: []string{py, "-m", "http.server", "{port}", "--bind", "127.0.0.1", "--directory", "{instance_dir}"},
		Health:  instances.HealthCheck{Type: "http", Path: "/", IntervalSeconds: 1}, MinGPUs: 1}})
	ag := f.startAgent(t)
	f.provision(t)
	ctx := principal.With(context.Background(), f.caller)
	i, err := f.svc.Launch(ctx, f.caller, f.proj, instances.LaunchSpec{Name: "files", AppSlug: "files", Version: "1",
		AllocationID: uuid.NullUUID{UUID: f.allocID, Valid: true}})
	if err != nil || i.State != lifecycle.Requested {
		t.Fatalf("launch: %+v %v", i, err)
	}
	running := f.until(t, i.ID, lifecycle.Running)
	if running.RunningAt == nil || running.LastReportAt == nil {
		t.Fatalf("running: %+v", running)
	}
	in, ok := ag.sup.Get(i.ID.String())
	if !ok || in.PID <= 0 || in.Port != i.Port {
		t.Fatalf("the agent's instance: %+v %v (port %d)", in, ok, i.Port)
	}
	reportAudits := f.audits(instances.ActionControllerReport, i.ID)
	if reportAudits < 1 || reportAudits > 2 { // starting (unless the ack won the race), running
		t.Fatalf("%d report audit rows after start", reportAudits)
	}
	// The agent resends its reports every ReportInterval: telemetry only.
	seen := f.applied.Load()
	wait(t, "ten more reports", func() bool { return f.applied.Load() >= seen+10 })
	if got := f.audits(instances.ActionControllerReport, i.ID); got != reportAudits {
		t.Fatalf("resent reports wrote audit rows: %d, was %d", got, reportAudits)
	}

	// The agent restarts while the app runs: the new agent adopts the process and
	// reports it running again; nothing changes, nothing is audited.
	ag.stop()
	seen = f.applied.Load()
	ag = f.startAgent(t)
	wait(t, "reports from the new agent", func() bool { return f.applied.Load() > seen+2 })
	after, _ := ag.sup.Get(i.ID.String())
	if got, _ := f.svc.Get(context.Background(), f.proj.ID, i.ID); got.State != lifecycle.Running || after.PID != in.PID {
		t.Fatalf("after the agent restart: %s, pid %d (was %d)", got.State, after.PID, in.PID)
	}
	if got := f.audits(instances.ActionControllerReport, i.ID); got != reportAudits {
		t.Fatalf("the agent restart wrote audit rows: %d, was %d", got, reportAudits)
	}

	stopping, err := f.svc.Stop(ctx, f.caller, f.proj, i.ID)
	if err != nil || stopping.State != lifecycle.Stopping {
		t.Fatalf("stop: %+v %v", stopping, err)
	}
	stopped := f.until(t, i.ID, lifecycle.Stopped)
	if stopped.EndedAt == nil {
		t.Fatalf("stopped: %+v", stopped)
	}
	wait(t, "the process group gone", func() bool { return syscall.Kill(-in.PID, 0) != nil })
}

// An app that never passes its health check: the agent gives up after the startup
// timeout and the instance fails with the agent's reason.
func TestNeverHealthyWithARealAgent(t *testing.T) {
	t.Parallel()
	py := python(t)
	f := newField(t, instances.Config{HealthTimeout: 2 * time.Second}, map[string]instances.Version{"deaf@1": {AppSlug: "deaf", Version: "1",
		// Listens nowhere: the TCP health check never passes.
		Command: []string{py, "-c", "import time; time.sleep(600)"},
		Health:  instances.HealthCheck{Type: "tcp", IntervalSeconds: 1}}})
	f.startAgent(t)
	f.provision(t)
	ctx := principal.With(context.Background(), f.caller)
	i, err := f.svc.Launch(ctx, f.caller, f.proj, instances.LaunchSpec{Name: "deaf", AppSlug: "deaf", Version: "1",
		AllocationID: uuid.NullUUID{UUID: f.allocID, Valid: true}})
	if err != nil {
		t.Fatal(err)
	}
	failed := f.until(t, i.ID, lifecycle.Failed)
	if failed.StateReason == nil || !strings.Contains(*failed.StateReason, "never_healthy") {
		t.Fatalf("failed without the reason: %v", failed.StateReason)
	}
	if f.audits(instances.ActionControllerReport, i.ID)+f.audits("app_instance.health_timeout", i.ID) < 1 {
		t.Fatal("the failure is audited")
	}
}

// Bootstrap SSH trust through a real agent: the launch's app.bootstrap_ssh reaches the
// node, the agent writes the instance's authorized_keys and reports success (trusted);
// identical reconciles afterwards enqueue and audit nothing; a revoke is one more task.
func TestBootstrapSSHWithARealAgent(t *testing.T) {
	t.Parallel()
	py := python(t)
	f := newField(t, instances.Config{}, map[string]instances.Version{"mpi@1": {AppSlug: "mpi", Version: "1",
		Command: []string{py, "-m", "http.server", "{port}", "--bind", "127.0.0.1", "--directory", "{instance_dir}"},
		Health:  instances.HealthCheck{Type: "tcp", IntervalSeconds: 1}, BootstrapSSH: true}})
	key := sshKey(t)
	f.allocs.set(f.allocID, "active")
	x := f.allocs.m[f.allocID]
	x.SshPublicKeys = []string{key}
	f.allocs.m[f.allocID] = x
	f.startAgent(t)
	f.provision(t)
	ctx := principal.With(context.Background(), f.caller)
	i, err := f.svc.Launch(ctx, f.caller, f.proj, instances.LaunchSpec{Name: "mpi", AppSlug: "mpi", Version: "1",
		AllocationID: uuid.NullUUID{UUID: f.allocID, Valid: true}})
	if err != nil {
		t.Fatal(err)
	}
	f.until(t, i.ID, lifecycle.Running)
	state := func() string {
		st, err := f.svc.BootstrapStates(context.Background(), []instances.Instance{i})
		if err != nil {
			t.Fatal(err)
		}
		return st[i.ID]
	}
	wait(t, "trusted", func() bool { return state() == "trusted" })
	var keyFile string
	matches, _ := filepathGlob(f.dir, i.ID.String())
	for _, m := range matches {
		keyFile = m
	}
	if keyFile == "" {
		t.Fatalf("no authorized_keys for the instance under %s", f.dir)
	}
	if b, err := os.ReadFile(keyFile); err != nil || !strings.Contains(string(b), "\n"+key+"\n") || strings.Count(string(b), "ssh-") != 1 {
		t.Fatalf("authorized_keys: %q %v", b, err)
	}
	for n := 0; n < 5; n++ {
		if enq, err := f.svc.ReconcileBootstrapSSH(context.Background(), i.ID, instances.TrustTrusted, []string{key}); err != nil || enq {
			t.Fatalf("identical reconcile %d: %v %v", n, enq, err)
		}
	}
	if got := f.audits(instances.ActionBootstrapSSH, i.ID); got != 1 {
		t.Fatalf("%d bootstrap audit rows, want 1", got)
	}
	if enq, err := f.svc.ReconcileBootstrapSSH(context.Background(), i.ID, instances.TrustRevoked, nil); err != nil || !enq {
		t.Fatalf("revoke: %v %v", enq, err)
	}
	wait(t, "the revoke applied", func() bool {
		_ = f.svc.Reconcile(context.Background())
		_, err := os.Stat(keyFile)
		return os.IsNotExist(err) && state() == "not_required"
	})
}

// filepathGlob finds <dir>/**/.gantry/apps/<id>/.ssh/authorized_keys.
func filepathGlob(dir, id string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, filepath.Join(id, ".ssh", "authorized_keys")) {
			out = append(out, p)
		}
		return nil
	})
	return out, err
}
