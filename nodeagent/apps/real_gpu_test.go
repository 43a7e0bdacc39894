//go:build nvml

package apps_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/gantry-gpu/gantry/nodeagent/apps"
	"github.com/gantry-gpu/gantry/nodeagent/gpu"
	"github.com/gantry-gpu/gantry/nodeagent/runtime"
	"github.com/gantry-gpu/gantry/nodeagent/tasks"
	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/alloctask"
)

// probeScript records what the app process sees, then serves HTTP: its uid, its
// CUDA_VISIBLE_DEVICES, what the CUDA driver API counts (libcuda honours
// CUDA_VISIBLE_DEVICES; nvidia-smi does not), and nvidia-smi's list.
const probeScript = `exec > "$GANTRY_APP_DIR/probe.txt" 2>&1
echo "uid=$(id -u)"
echo "cuda_visible=$CUDA_VISIBLE_DEVICES"
$PY -c '
import ctypes
c = ctypes.CDLL("libcuda.so.1")
r = c.cuInit(0)
n = ctypes.c_int(0)
if r == 0:
    c.cuDeviceGetCount(ctypes.byref(n))
print("cuda_init=%d cuda_devices=%d" % (r, n.value))
'
nvidia-smi --query-gpu=uuid --format=csv,noheader | sed "s/^/smi=/"
exec $PY -m http.server "$PORT" --bind 127.0.0.1 --directory "$GANTRY_APP_DIR"`

// TestAppOnRealGPU runs apps under the linux-user runtime as root on a real NVIDIA
// host (scripts/device-apps-check.sh): an app in an allocation with the first GPU runs
// as the allocation's user and the CUDA driver counts exactly that GPU; an app in an
// allocation without GPUs counts none. Both are reported running and stop cleanly.
func TestAppOnRealGPU(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the linux-user runtime needs root")
	}
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Fatalf("python3: %v", err)
	}
	backend, err := gpu.Open(gpu.BackendNVML, gpu.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	inv, err := backend.Inventory(context.Background())
	if err != nil || len(inv.GPUs) == 0 {
		t.Fatalf("inventory %+v %v", inv, err)
	}
	homes, err := os.MkdirTemp("/home", "gantry-apps-test-")
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(homes, 0o755)
	t.Cleanup(func() { _ = os.RemoveAll(homes) })
	dir := t.TempDir()
	rt, err := runtime.New(runtime.Options{Driver: &runtime.LinuxUser{HomeRoot: homes, Runner: runtime.Exec{}, Logger: logger(t)},
		StateDir: dir, Inventory: backend, AdvertiseHost: "gpu-real", StopGrace: 2 * time.Second, Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	sup, err := apps.New(apps.Options{Envs: rt, StateDir: dir, Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	mux := rt.Mux()
	sup.Register(mux)
	rt.NotifyInactive(func(id, _ string) { sup.EndAllocation(id) })
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); sup.Wait() }()
	if err := sup.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, dir: dir, inv: inv, rt: rt, sup: sup, mux: mux, cancel: cancel}

	provision := func(gpus ...int) alloctask.Payload {
		id := uuid.NewString()
		p := alloctask.Payload{AllocationID: id, TenantID: uuid.NewString(), ProjectID: uuid.NewString(), User: alloctask.UserName(id)}
		for _, i := range gpus {
			p.GPUs = append(p.GPUs, alloctask.GPU{UUID: inv.GPUs[i].UUID, Index: i})
		}
		if _, err := rt.Provision(context.Background(), p); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rt.Release(context.Background(), p) })
		return p
	}
	for _, c := range []struct {
		name    string
		gpus    []int
		visible string
		devices string
	}{
		{"one GPU", []int{0}, inv.GPUs[0].UUID, "cuda_init=0 cuda_devices=1"},
		{"no GPU", nil, "", "cuda_devices=0"},
	} {
		p := provision(c.gpus...)
		env, ok := rt.Session(p.AllocationID)
		if !ok || !env.RealUser || env.UID == 0 {
			t.Fatalf("%s: session %+v %v", c.name, env, ok)
		}
		s := &fabricv1.AppStartTask{
			AppInstanceId: uuid.NewString(), AllocationId: p.AllocationID, AppSlug: "probe", Version: "1",
			Command:     []string{"/bin/sh", "-c", probeScript},
			Env:         map[string]string{"PY": py},
			HealthCheck: &fabricv1.AppHealthCheck{Type: apptask.HealthHTTP, HttpPath: "/", Interval: durationpb.New(200 * time.Millisecond)},
		}
		if res := n.run(apptask.KindStart, s); res.Status != tasks.Succeeded {
			t.Fatalf("%s: start %+v", c.name, res)
		}
		in := n.waitState(s.AppInstanceId, apptask.StateRunning)
		b, err := os.ReadFile(filepath.Join(env.Dir, ".gantry", "apps", s.AppInstanceId, "probe.txt"))
		if err != nil {
			t.Fatal(err)
		}
		probe := string(b)
		t.Logf("%s (allocation user %s uid %d):\n%s", c.name, env.User, env.UID, probe)
		for _, want := range []string{"uid=" + strconv.Itoa(int(env.UID)) + "\n", "cuda_visible=" + c.visible + "\n", c.devices} {
			if !strings.Contains(probe, want) {
				t.Errorf("%s: probe lacks %q", c.name, want)
			}
		}
		if res := n.run(apptask.KindStop, &fabricv1.AppStopTask{AppInstanceId: s.AppInstanceId, Grace: durationpb.New(2 * time.Second)}); res.Status != tasks.Succeeded {
			t.Fatalf("%s: stop %+v", c.name, res)
		}
		waitGone(t, in.PID)
	}
}
