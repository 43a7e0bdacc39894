package apps_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/gantry-gpu/gantry/nodeagent/apps"
	"github.com/gantry-gpu/gantry/nodeagent/gpu"
	"github.com/gantry-gpu/gantry/nodeagent/runtime"
	"github.com/gantry-gpu/gantry/nodeagent/tasks"
	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/alloctask"
)

// The test binary doubles as the app: with APPTEST_MODE set it runs one of these
// instead of the tests.
//
//	http   serves 127.0.0.1:$PORT: /health (500 while $APPTEST_FAIL_FILE exists),
//	       /info (what the process sees), /quit (exits 7), /bytes?n= (n zero bytes)
//	crash  prints "boom" and exits 3
//	sleep  never listens
func TestMain(m *testing.M) {
	switch os.Getenv("APPTEST_MODE") {
	case "":
		os.Exit(m.Run())
	case "crash":
		fmt.Println("boom")
		os.Exit(3)
	case "sleep":
		select {}
	case "http":
		serveTestApp()
	}
	os.Exit(2)
}

func serveTestApp() {
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		if f := os.Getenv("APPTEST_FAIL_FILE"); f != "" {
			if _, err := os.Stat(f); err == nil {
				http.Error(w, "failing", http.StatusInternalServerError)
				return
			}
		}
		_, _ = io.WriteString(w, "ok")
	})
	mux.HandleFunc("/info", func(w http.ResponseWriter, r *http.Request) {
		wd, _ := os.Getwd()
		fmt.Fprintf(w, "args=%s\n", strings.Join(os.Args[1:], " "))
		fmt.Fprintf(w, "wd=%s\n", wd)
		for _, k := range []string{"CUDA_VISIBLE_DEVICES", "GANTRY_ALLOCATION_ID", "GANTRY_APP_INSTANCE_ID", "GANTRY_APP_BASE_PATH", "APP_GREETING", "PORT", "SECRET_OF_THE_AGENT", "GANTRY_APP_SSH_AUTHORIZED_KEYS"} {
			fmt.Fprintf(w, "%s=%s\n", k, os.Getenv(k))
		}
	})
	mux.HandleFunc("/quit", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "bye")
		go func() { time.Sleep(50 * time.Millisecond); os.Exit(7) }()
	})
	mux.HandleFunc("/bytes", func(w http.ResponseWriter, r *http.Request) {
		var n int64
		_, _ = fmt.Sscan(r.URL.Query().Get("n"), &n)
		_, _ = io.CopyN(w, zeros{}, n)
	})
	_ = http.ListenAndServe("127.0.0.1:"+os.Getenv("PORT"), mux)
	os.Exit(1)
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

type testLog struct{ t *testing.T }

func (w testLog) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

func logger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// node is one test host: a real process runtime over mock H100s and a supervisor.
type node struct {
	t      *testing.T
	dir    string
	inv    gpu.Inventory
	rt     *runtime.Runtime
	sup    *apps.Supervisor
	mux    *tasks.Mux
	cancel context.CancelFunc
}

func newNode(t *testing.T) *node {
	t.Helper()
	m, err := gpu.NewMock(gpu.BackendMockH100, gpu.Options{MockSeed: "apps-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	inv, err := m.Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, dir: t.TempDir(), inv: inv}
	n.rt, err = runtime.New(runtime.Options{
		Driver: &runtime.Process{Root: n.dir + "/allocations"}, StateDir: n.dir, Inventory: m,
		AdvertiseHost: "gpu-01.example", StopGrace: 2 * time.Second, Logger: logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	n.start()
	return n
}

// start builds a supervisor over the node's state directory (again: the agent after a
// restart) and restores what the previous one left.
func (n *node) start() {
	n.t.Helper()
	sup, err := apps.New(apps.Options{Envs: n.rt, StateDir: n.dir, Logger: logger(n.t)})
	if err != nil {
		n.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := sup.Restore(ctx); err != nil {
		n.t.Fatal(err)
	}
	n.sup, n.cancel = sup, cancel
	n.mux = n.rt.Mux()
	sup.Register(n.mux)
	n.rt.NotifyInactive(func(id, _ string) { sup.EndAllocation(id) })
	n.t.Cleanup(func() {
		for _, in := range sup.Instances() {
			if in.PID > 0 {
				_ = syscall.Kill(-in.PID, syscall.SIGKILL)
			}
		}
		cancel()
		sup.Wait()
	})
}

// restart ends supervision (processes keep running) and starts a new supervisor.
func (n *node) restart() {
	n.cancel()
	n.sup.Wait()
	n.start()
}

// allocation provisions an allocation with the GPUs at indices.
func (n *node) allocation(indices ...int) string {
	n.t.Helper()
	id := uuid.NewString()
	p := alloctask.Payload{AllocationID: id, TenantID: uuid.NewString(), ProjectID: uuid.NewString(), User: alloctask.UserName(id)}
	for _, i := range indices {
		p.GPUs = append(p.GPUs, alloctask.GPU{UUID: n.inv.GPUs[i].UUID, Index: i})
	}
	if _, err := n.rt.Provision(context.Background(), p); err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { _ = n.rt.Release(context.Background(), p) })
	return id
}

func (n *node) stopAllocation(id string) {
	n.t.Helper()
	p := alloctask.Payload{AllocationID: id, TenantID: uuid.NewString(), ProjectID: uuid.NewString(), User: alloctask.UserName(id)}
	if err := n.rt.Stop(context.Background(), p); err != nil {
		n.t.Fatal(err)
	}
}

func testExe(t *testing.T) string {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// spec is an app.start for the test app in mode, fast timings.
func spec(t *testing.T, allocationID, mode string) *fabricv1.AppStartTask {
	return &fabricv1.AppStartTask{
		AppInstanceId: uuid.NewString(), AllocationId: allocationID, AppSlug: "test-app", Version: "1",
		Command: []string{testExe(t)},
		Env:     map[string]string{"APPTEST_MODE": mode},
		HealthCheck: &fabricv1.AppHealthCheck{Type: apptask.HealthHTTP, HttpPath: "/health",
			Interval: durationpb.New(50 * time.Millisecond), Timeout: durationpb.New(time.Second), FailureThreshold: 2},
		StartupTimeout: durationpb.New(30 * time.Second),
		BackoffMin:     durationpb.New(20 * time.Millisecond),
		BackoffMax:     durationpb.New(100 * time.Millisecond),
	}
}

// run executes one task through the mux, as the agent does.
func (n *node) run(kind string, payload proto.Message) tasks.Result {
	n.t.Helper()
	b, err := apptask.Encode(payload)
	if err != nil {
		n.t.Fatal(err)
	}
	return n.mux.Execute(context.Background(), tasks.Task{ID: uuid.NewString(), Kind: kind, Payload: b, ContentType: apptask.ContentType, Attempt: 1})
}

// waitState polls until the instance is in state (20 s at most).
func (n *node) waitState(id, state string) apps.Instance {
	n.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		in, ok := n.sup.Get(id)
		if ok && in.State == state {
			return in
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("instance %s: %+v (found %v), want state %s", id, in, ok, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func get(t *testing.T, port int, path string) string {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// processGone reports whether no process of the group pid is left.
func processGone(pid int) bool { return syscall.Kill(-pid, 0) != nil }

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !processGone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process group %d still alive", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
