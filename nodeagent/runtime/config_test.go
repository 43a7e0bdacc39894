package runtime

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/gantry-gpu/gantry/nodeagent/config"
)

func TestSelectedNameAndStateDir(t *testing.T) {
	cfg := config.Default()
	cfg.Path = "/etc/gantry/nodeagent.conf"
	for backend, want := range map[string]string{"mock-h100": NameProcess, "mock-b200": NameProcess, "nvml": NameLinuxUser} {
		cfg.GPUBackend = backend
		if got := SelectedName(cfg); got != want {
			t.Errorf("auto on %s: %s, want %s", backend, got, want)
		}
	}
	cfg.Runtime = NameProcess
	if got := SelectedName(cfg); got != NameProcess {
		t.Errorf("explicit process on nvml: %s", got)
	}
	if got := StateDir(cfg); got != "/etc/gantry/state" {
		t.Errorf("default state dir %s", got)
	}
	cfg.StateDir = "/var/lib/gantry-nodeagent"
	if got := StateDir(cfg); got != "/var/lib/gantry-nodeagent" {
		t.Errorf("absolute state dir %s", got)
	}
	cfg.StateDir = "alloc-state"
	if got := StateDir(cfg); got != "/etc/gantry/alloc-state" {
		t.Errorf("relative state dir %s", got)
	}
}

// TestFromConfigDevelopmentDefaults is what `make dev` gets: a mock backend, no runtime
// setting, a config in a directory of its own: the process runtime with its state beside
// the config, advertising the configured hostname on port 22.
func TestFromConfigDevelopmentDefaults(t *testing.T) {
	gpus := mockGPUs(t)
	cfg := config.Default()
	cfg.Path = filepath.Join(t.TempDir(), "nodeagent.conf")
	cfg.GPUBackend, cfg.Hostname = "mock-h100", "dev-node"
	r, err := FromConfig(cfg, gpus, logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if r.Name() != NameProcess {
		t.Fatalf("runtime %s", r.Name())
	}
	p := payload(t, inventory(t, gpus), 0)
	res, err := r.Provision(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if res.Host != "dev-node" || res.Port != 22 || res.User != p.User {
		t.Fatalf("result %+v", res)
	}
	s, ok := r.Session(p.AllocationID)
	if !ok || s.Dir != filepath.Join(filepath.Dir(cfg.Path), "state", "allocations", p.AllocationID, "home") {
		t.Fatalf("session %+v", s)
	}
	cfg.AdvertiseHost, cfg.SSHPort = "ssh.gpu-01.example", 2200
	r, err = FromConfig(cfg, gpus, logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := r.Provision(context.Background(), p); err != nil || res.Host != "ssh.gpu-01.example" || res.Port != 2200 {
		t.Fatalf("advertised %+v %v", res, err)
	}
}
