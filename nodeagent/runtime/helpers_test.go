package runtime

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/nodeagent/gpu"
	"github.com/gantry-gpu/gantry/shared/alloctask"
	"github.com/google/uuid"
)

// mockGPUs is a real mock DGX H100 backend (go-nvml's, as the agent runs it in
// development), seeded so its UUIDs are stable.
func mockGPUs(t *testing.T) *gpu.Mock {
	t.Helper()
	m, err := gpu.NewMock(gpu.BackendMockH100, gpu.Options{MockSeed: "runtime-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

func inventory(t *testing.T, inv Inventory) gpu.Inventory {
	t.Helper()
	i, err := inv.Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// payload builds a valid payload for a fresh allocation id with the GPUs at the given
// indices of inv.
func payload(t *testing.T, inv gpu.Inventory, indices ...int) alloctask.Payload {
	t.Helper()
	id := uuid.NewString()
	p := alloctask.Payload{
		AllocationID: id,
		TenantID:     uuid.NewString(),
		ProjectID:    uuid.NewString(),
		User:         alloctask.UserName(id),
		SSHPublicKeys: []string{
			"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGantryTestKeyOne alice@laptop",
			"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGantryTestKeyTwo alice@desktop",
		},
	}
	for _, i := range indices {
		p.GPUs = append(p.GPUs, alloctask.GPU{UUID: inv.GPUs[i].UUID, Index: i})
	}
	return p
}

type testLog struct{ t *testing.T }

func (w testLog) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

func logger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// newProcessRuntime opens a process runtime over dir (a second call over the same dir
// is the agent after a restart).
func newProcessRuntime(t *testing.T, dir string, inv Inventory) *Runtime {
	t.Helper()
	r, err := New(Options{
		Driver:        &Process{Root: dir + "/allocations"},
		StateDir:      dir,
		Inventory:     inv,
		AdvertiseHost: "gpu-01.example",
		SSHPort:       2222,
		StopGrace:     300 * time.Millisecond,
		Logger:        logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func code(err error) string {
	if err == nil {
		return ""
	}
	return Code(err)
}

// envMap turns KEY=VALUE pairs into a map.
func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// parseEnvFile reads an env file the way sh would for our simple quoting.
func parseEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		kv, ok := strings.CutPrefix(line, "export ")
		k, v, ok2 := strings.Cut(kv, "=")
		if !ok || !ok2 || len(v) < 2 || v[0] != '\'' || v[len(v)-1] != '\'' {
			t.Fatalf("env file line %q", line)
		}
		m[k] = v[1 : len(v)-1]
	}
	return m
}

// started is a process a test started, with its exit observed in the background.
type started struct {
	cmd  *exec.Cmd
	done chan error
}

func start(t *testing.T, cmd *exec.Cmd) *started {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &started{cmd: cmd, done: make(chan error, 1)}
	go func() { s.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-s.done
	})
	return s
}

// ended waits (up to 30 s) for the process to exit and returns how.
func (s *started) ended(t *testing.T) error {
	t.Helper()
	select {
	case err := <-s.done:
		s.done <- err // for the cleanup
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("pid %d still running", s.cmd.Process.Pid)
		return nil
	}
}

// running reports whether the process has not exited.
func (s *started) running() bool {
	select {
	case err := <-s.done:
		s.done <- err
		return false
	default:
		return true
	}
}

// waitFound polls find until it lists pid (the process is up and tagged).
func waitFound(t *testing.T, pid int, find func() ([]int, error)) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		pids, err := find()
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(pids, pid) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d never found among %v", pid, pids)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// killedBySignal reports whether err is the exit of a process killed by sig.
func killedBySignal(err error, sig string) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee) && strings.Contains(ee.String(), "signal: "+sig)
}

// recorder is the real Exec runner that also counts the commands it ran, so tests can
// say "useradd ran once" while every command still runs for real.
type recorder struct {
	Exec
	mu   sync.Mutex
	runs []string
}

func (r *recorder) Run(ctx context.Context, name string, args ...string) (Result, error) {
	r.mu.Lock()
	r.runs = append(r.runs, name+" "+strings.Join(args, " "))
	r.mu.Unlock()
	return r.Exec.Run(ctx, name, args...)
}

func (r *recorder) count(prefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.runs {
		if strings.HasPrefix(c, prefix) {
			n++
		}
	}
	return n
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }
