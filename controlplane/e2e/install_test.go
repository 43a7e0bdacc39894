package e2e_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/nodeagent/config"
	"github.com/gantry-gpu/gantry/proto/api"
)

// buildAgent compiles the real gantry-nodeagent binary.
func buildAgent(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gantry-nodeagent")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/gantry-gpu/gantry/nodeagent/cmd/gantry-nodeagent")
	cmd.Env = append(os.Environ(), "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestInstallScriptEnrollsInOneStepAndBinaryRuns runs deploy/install-nodeagent.sh
// (under a scratch root, without systemctl) against a real control plane, runs it a
// second time (idempotent: nothing reinstalled, no second enrollment), then starts the
// installed binary as the systemd unit would, waits for the node to be online on mock
// H100s, and stops it with SIGTERM, which must exit 0.
func TestInstallScriptEnrollsInOneStepAndBinaryRuns(t *testing.T) {
	c := startCP(t)
	nodeID, token := c.newNode("gpu-installed-01")
	bin := buildAgent(t)
	root := t.TempDir()
	script, err := filepath.Abs("../../deploy/install-nodeagent.sh")
	if err != nil {
		t.Fatal(err)
	}
	install := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("bash", append([]string{script, "--root", root, "--binary", bin, "--server", c.url, "--gpu-backend", "mock-h100", "--hostname", "gpu-installed-01"}, args...)...)
		cmd.Env = append(os.Environ(), "GANTRY_NODEAGENT_ENROLLMENT_TOKEN="+token)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("install: %v\n%s", err, out)
		}
		return string(out)
	}
	first := install()
	if !strings.Contains(first, "enrolled node "+nodeID.String()) {
		t.Fatalf("first install:\n%s", first)
	}
	second := install() // the one-time token is spent: enrolling again would fail
	if !strings.Contains(second, "already enrolled as node "+nodeID.String()) || !strings.Contains(second, "is up to date") {
		t.Fatalf("second install:\n%s", second)
	}

	confPath := filepath.Join(root, "etc/gantry/nodeagent.conf")
	cfg, err := config.Load(confPath, false, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NodeID != nodeID.String() || cfg.GPUBackend != "mock-h100" || cfg.Hostname != "gpu-installed-01" || cfg.ServerURL != c.url {
		t.Fatalf("installed config %+v", cfg)
	}
	for path, mode := range map[string]os.FileMode{
		filepath.Join(root, "etc/gantry/node-token"):                       0o600,
		filepath.Join(root, "usr/local/bin/gantry-nodeagent"):              0o755,
		filepath.Join(root, "etc/systemd/system/gantry-nodeagent.service"): 0o644,
	} {
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != mode {
			t.Fatalf("%s: %v mode %v, want %#o", path, err, fi, mode)
		}
	}

	var logs bytes.Buffer
	run := exec.Command(filepath.Join(root, "usr/local/bin/gantry-nodeagent"), "run")
	run.Env = append(os.Environ(), "GANTRY_NODEAGENT_CONFIG="+confPath)
	run.Stdout, run.Stderr = &logs, &logs
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- run.Wait() }()
	t.Cleanup(func() { _ = run.Process.Kill() })

	eventually(t, "installed agent online", func() bool {
		n, ok := c.fleetNode(nodeID)
		return ok && n.Status == api.NodeStatusOnline && len(n.Gpus) == 8 && n.Gpus[0].Model == "NVIDIA H100 80GB HBM3"
	})
	if err := run.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("agent exited with %v after SIGTERM\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("agent did not exit after SIGTERM\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), `"msg":"agent stopped"`) {
		t.Fatalf("no clean-stop log line:\n%s", logs.String())
	}
	eventually(t, "session gone", func() bool { return c.app.Fabric.LocalSessions() == 0 })
}
