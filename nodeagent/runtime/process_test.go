package runtime

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/shared/alloctask"
)

// TestProcessFullCycle walks one allocation through provision, restart, stop and release
// on the process runtime, checking the workspace, the environment and the processes at
// each step.
func TestProcessFullCycle(t *testing.T) {
	ctx := context.Background()
	gpus := mockGPUs(t)
	inv := inventory(t, gpus)
	dir := t.TempDir()
	r := newProcessRuntime(t, dir, gpus)
	p := payload(t, inv, 5, 2) // out of order on purpose: the environment lists index order
	ws := filepath.Join(dir, "allocations", p.AllocationID)

	res, err := r.Provision(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if want := (alloctask.ProvisionResult{Host: "gpu-01.example", Port: 2222, User: p.User}); res != want {
		t.Fatalf("result %+v, want %+v", res, want)
	}
	if fi, err := os.Stat(filepath.Join(ws, "home")); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("home: %v %v", fi, err)
	}
	keys, err := os.ReadFile(filepath.Join(ws, "authorized_keys"))
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(ws, "authorized_keys")); fi.Mode().Perm() != 0o600 {
		t.Fatalf("authorized_keys mode %#o", fi.Mode().Perm())
	}
	if got := nonComment(string(keys)); !slices.Equal(got, p.SSHPublicKeys) {
		t.Fatalf("authorized_keys %q", got)
	}
	wantEnv := map[string]string{
		"CUDA_VISIBLE_DEVICES":   inv.GPUs[2].UUID + "," + inv.GPUs[5].UUID,
		"NVIDIA_VISIBLE_DEVICES": inv.GPUs[2].UUID + "," + inv.GPUs[5].UUID,
		"CUDA_DEVICE_ORDER":      "PCI_BUS_ID",
		"GANTRY_ALLOCATION_ID":   p.AllocationID,
		"HOME":                   filepath.Join(ws, "home"),
		"USER":                   p.User,
		"LOGNAME":                p.User,
	}
	fileEnv := parseEnvFile(t, filepath.Join(ws, "env"))
	for k, v := range wantEnv {
		if fileEnv[k] != v {
			t.Fatalf("env file %s = %q, want %q", k, fileEnv[k], v)
		}
	}
	s, ok := r.Session(p.AllocationID)
	if !ok || s.RealUser || s.UID != 0 || s.GID != 0 || s.User != p.User || s.Dir != filepath.Join(ws, "home") || s.Slice != "" {
		t.Fatalf("session %+v %v", s, ok)
	}
	if !mapsEqual(envMap(s.Env), fileEnv) || !slices.IsSorted(s.Env) {
		t.Fatalf("session env %v, file %v", s.Env, fileEnv)
	}

	// A process of the allocation (started with the session environment, as the terminal
	// does) ends on restart; the allocation stays active with the new keys.
	sleeper := start(t, tagged(s, "sleep", "300"))
	waitFound(t, sleeper.cmd.Process.Pid, func() ([]int, error) { return taggedPIDs("/proc", p.AllocationID) })
	other := start(t, exec.Command("sleep", "300")) // not the allocation's: must survive
	p.SSHPublicKeys = p.SSHPublicKeys[:1]
	if _, err := r.Restart(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := sleeper.ended(t); !killedBySignal(err, "terminated") {
		t.Fatalf("sleeper after restart: %v", err)
	}
	if keys, _ := os.ReadFile(filepath.Join(ws, "authorized_keys")); !slices.Equal(nonComment(string(keys)), p.SSHPublicKeys) {
		t.Fatalf("keys after restart %q", keys)
	}
	if _, ok := r.Session(p.AllocationID); !ok || r.Phase(p.AllocationID) != PhaseActive {
		t.Fatalf("phase after restart %q", r.Phase(p.AllocationID))
	}

	// Stop: a process that ignores SIGTERM is killed after the grace; the workspace stays.
	stubborn := start(t, tagged(s, "sh", "-c", `trap "" TERM; exec sleep 300`))
	waitFound(t, stubborn.cmd.Process.Pid, func() ([]int, error) { return taggedPIDs("/proc", p.AllocationID) })
	if err := r.Stop(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := stubborn.ended(t); !killedBySignal(err, "killed") {
		t.Fatalf("stubborn after stop: %v", err)
	}
	if _, ok := r.Session(p.AllocationID); ok || r.Phase(p.AllocationID) != PhaseStopped {
		t.Fatalf("stopped allocation: session %v phase %q", ok, r.Phase(p.AllocationID))
	}
	if _, err := os.Stat(filepath.Join(ws, "home")); err != nil {
		t.Fatalf("stop removed the workspace: %v", err)
	}

	// Release removes the workspace and leaves a tombstone.
	if err := r.Release(ctx, p); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ws); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("workspace after release: %v", err)
	}
	if r.Phase(p.AllocationID) != PhaseReleased {
		t.Fatalf("phase %q", r.Phase(p.AllocationID))
	}
	if _, err := os.Stat(filepath.Join(dir, "allocations", p.AllocationID+".json")); err != nil {
		t.Fatalf("tombstone: %v", err)
	}
	if !other.running() {
		t.Fatal("a process outside the allocation was killed")
	}
}

func tagged(s SessionEnv, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = append(slices.Clone(s.Env), "PATH="+os.Getenv("PATH"))
	cmd.Dir = s.Dir
	return cmd
}

func nonComment(s string) []string {
	var out []string
	for line := range strings.Lines(s) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			out = append(out, line)
		}
	}
	return out
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestProcessIdempotentAcrossAgentRestart: the same provision twice, then again on a
// new Runtime over the same state directory (the agent restarted, tasks.Once forgot),
// yields the same result and the same files; the new Runtime answers Session at once.
func TestProcessIdempotentAcrossAgentRestart(t *testing.T) {
	ctx := context.Background()
	gpus := mockGPUs(t)
	inv := inventory(t, gpus)
	dir := t.TempDir()
	p := payload(t, inv, 0)
	r1 := newProcessRuntime(t, dir, gpus)
	first, err := r1.Provision(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	envPath := filepath.Join(dir, "allocations", p.AllocationID, "env")
	before, _ := os.ReadFile(envPath)
	again, err := r1.Provision(ctx, p)
	if err != nil || again != first {
		t.Fatalf("second provision %+v %v", again, err)
	}

	r2 := newProcessRuntime(t, dir, gpus)
	if r2.Phase(p.AllocationID) != PhaseActive {
		t.Fatalf("phase after restart %q", r2.Phase(p.AllocationID))
	}
	s1, _ := r1.Session(p.AllocationID)
	s2, ok := r2.Session(p.AllocationID)
	if !ok || !slices.Equal(s1.Env, s2.Env) || s1.Dir != s2.Dir {
		t.Fatalf("session after restart %+v %v", s2, ok)
	}
	third, err := r2.Provision(ctx, p)
	if err != nil || third != first {
		t.Fatalf("provision after agent restart %+v %v", third, err)
	}
	if after, _ := os.ReadFile(envPath); string(after) != string(before) {
		t.Fatalf("env file changed:\n%s\n%s", before, after)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "allocations"))
	if len(entries) != 2 { // <id>.json and <id>/
		t.Fatalf("state dir has %d entries", len(entries))
	}

	// Stop on the restarted agent, then a redelivered stop after another restart.
	if err := r2.Stop(ctx, p); err != nil {
		t.Fatal(err)
	}
	r3 := newProcessRuntime(t, dir, gpus)
	if err := r3.Stop(ctx, p); err != nil || r3.Phase(p.AllocationID) != PhaseStopped {
		t.Fatalf("stop after restart: %v %q", err, r3.Phase(p.AllocationID))
	}
	if _, ok := r3.Session(p.AllocationID); ok {
		t.Fatal("stopped allocation has a session after restart")
	}
	// A provision redelivered after the stop reports success and does not unlock.
	if res, err := r3.Provision(ctx, p); err != nil || res != first || r3.Phase(p.AllocationID) != PhaseStopped {
		t.Fatalf("late provision: %+v %v %q", res, err, r3.Phase(p.AllocationID))
	}
}

// TestInvalidPayloadPersistsNothing: every invalid payload fails with invalid_payload,
// and neither a record nor a workspace appears.
func TestInvalidPayloadPersistsNothing(t *testing.T) {
	gpus := mockGPUs(t)
	inv := inventory(t, gpus)
	dir := t.TempDir()
	r := newProcessRuntime(t, dir, gpus)
	cases := map[string]func(*alloctask.Payload){
		"allocation id not a uuid": func(p *alloctask.Payload) { p.AllocationID = "not-a-uuid" },
		"upper-case allocation id": func(p *alloctask.Payload) { p.AllocationID = strings.ToUpper(p.AllocationID) },
		"user is root":             func(p *alloctask.Payload) { p.User = "root" },
		"user of another id":       func(p *alloctask.Payload) { p.User = "g000000000000" },
		"gpu listed twice":         func(p *alloctask.Payload) { p.GPUs = append(p.GPUs, p.GPUs[0]) },
		"index listed twice": func(p *alloctask.Payload) {
			p.GPUs = append(p.GPUs, alloctask.GPU{UUID: inv.GPUs[4].UUID, Index: p.GPUs[0].Index})
		},
		"negative index":  func(p *alloctask.Payload) { p.GPUs[0].Index = -1 },
		"too many gpus":   func(p *alloctask.Payload) { p.GPUs = slices.Repeat(p.GPUs[:1], alloctask.MaxGPUs+1) },
		"key spans lines": func(p *alloctask.Payload) { p.SSHPublicKeys[0] += "\nssh-ed25519 AAAA evil" },
		"empty key":       func(p *alloctask.Payload) { p.SSHPublicKeys[1] = "" },
		"too many keys": func(p *alloctask.Payload) {
			p.SSHPublicKeys = slices.Repeat(p.SSHPublicKeys[:1], alloctask.MaxSSHKeys+1)
		},
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			p := payload(t, inv, 1)
			mutate(&p)
			for _, op := range []func() error{
				func() error { _, err := r.Provision(context.Background(), p); return err },
				func() error { _, err := r.Restart(context.Background(), p); return err },
				func() error { return r.Stop(context.Background(), p) },
				func() error { return r.Release(context.Background(), p) },
			} {
				if err := op(); code(err) != alloctask.CodeInvalidPayload {
					t.Fatalf("err %v, want %s", err, alloctask.CodeInvalidPayload)
				}
			}
			assertNothingPersisted(t, dir)
		})
	}
}

func assertNothingPersisted(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dir, "allocations"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Fatalf("persisted: %v", entries)
	}
}

// TestUnknownGPU: a GPU that is not on this host, or not at the index the control plane
// believes, fails with gpu_unavailable and leaves nothing.
func TestUnknownGPU(t *testing.T) {
	gpus := mockGPUs(t)
	inv := inventory(t, gpus)
	dir := t.TempDir()
	r := newProcessRuntime(t, dir, gpus)

	p := payload(t, inv, 1)
	p.GPUs = append(p.GPUs, alloctask.GPU{UUID: "GPU-00000000-0000-0000-0000-000000000000", Index: 7})
	if _, err := r.Provision(context.Background(), p); code(err) != alloctask.CodeGPUUnavailable {
		t.Fatalf("unknown gpu: %v", err)
	}
	p = payload(t, inv, 1)
	p.GPUs[0].Index = 6
	if _, err := r.Restart(context.Background(), p); code(err) != alloctask.CodeGPUUnavailable {
		t.Fatalf("wrong index: %v", err)
	}
	assertNothingPersisted(t, dir)
}

// TestReleaseOfUnknownAllocation: releasing an allocation this node never saw succeeds
// (already clean), leaves a tombstone, and a provision arriving late is refused.
func TestReleaseOfUnknownAllocation(t *testing.T) {
	gpus := mockGPUs(t)
	inv := inventory(t, gpus)
	dir := t.TempDir()
	r := newProcessRuntime(t, dir, gpus)
	p := payload(t, inv, 3)
	if err := r.Release(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	if err := r.Release(context.Background(), p); err != nil {
		t.Fatalf("second release: %v", err)
	}
	if _, err := r.Provision(context.Background(), p); code(err) != alloctask.CodeNotFound {
		t.Fatalf("provision after release: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "allocations", p.AllocationID)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a refused provision created the workspace: %v", err)
	}
}

// TestFailedFirstProvisionRollsBack: a provision that fails half-way leaves no record
// and no workspace (the control plane fails the allocation and may never release it).
func TestFailedFirstProvisionRollsBack(t *testing.T) {
	gpus := mockGPUs(t)
	inv := inventory(t, gpus)
	dir := t.TempDir()
	r := newProcessRuntime(t, dir, gpus)
	p := payload(t, inv, 0)
	// A file where the workspace's home must go makes the driver fail.
	ws := filepath.Join(dir, "allocations", p.AllocationID)
	if err := os.MkdirAll(ws, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "home"), []byte("in the way"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Provision(context.Background(), p); code(err) != alloctask.CodeRuntimeFailed {
		t.Fatalf("err %v", err)
	}
	if r.Phase(p.AllocationID) != PhaseNone {
		t.Fatalf("phase %q", r.Phase(p.AllocationID))
	}
	assertNothingPersisted(t, dir)
}
