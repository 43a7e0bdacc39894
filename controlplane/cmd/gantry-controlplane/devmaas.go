package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/devenv"
	"github.com/gantry-gpu/gantry/controlplane/internal/maas/maastest"
)

// devMaasMachines are the machines `make dev` puts in the simulated MAAS: fixed system
// ids so the README's walkthrough can name them.
var devMaasMachines = []maastest.MachineSpec{
	{SystemID: "sim001", Hostname: "gpu-sim-01", GPU: "mock-h100", Tags: []string{"gpu", "h100"}},
	{SystemID: "sim002", Hostname: "gpu-sim-02", GPU: "mock-h100", Tags: []string{"gpu", "h100"}},
	{SystemID: "sim003", Hostname: "gpu-sim-03", GPU: "mock-a100", GPUCount: 8, Tags: []string{"gpu", "a100"}},
	{SystemID: "sim004", Hostname: "gpu-sim-04", GPU: "mock-h100", New: true, Tags: []string{"gpu", "h100"}},
}

// devMaasDurations are long enough to watch each step in the API, short enough to
// onboard a machine in under a minute.
var devMaasDurations = maastest.Durations{
	Commissioning: 5 * time.Second, Testing: 2 * time.Second, Deploying: 10 * time.Second, Releasing: 2 * time.Second,
	QuickErase: 5 * time.Second, SecureErase: 15 * time.Second, FullErase: time.Minute,
}

// startDevMaas starts the MAAS simulator when GANTRY_DEV_MAAS=1 (else does nothing):
// it builds the node agent package from this checkout and points the control plane at
// it (GANTRY_NODEAGENT_PACKAGE), serves a simulated MAAS on GANTRY_DEV_MAAS_ADDR
// (default 127.0.0.1:5240, MAAS's port) with devMaasMachines, whose deployments boot the
// agent for real under <dir>/maas/machines, and writes its URL and API key to
// <dir>/maas.env. It returns the function that stops it; failures are reported and
// leave the rest of make dev running.
func startDevMaas(ctx context.Context, dir string, notef func(string, ...any)) (stop func()) {
	stop = func() {}
	if v := os.Getenv("GANTRY_DEV_MAAS"); v != "1" && v != "true" {
		return stop
	}
	base := filepath.Join(dir, "maas")
	if err := os.MkdirAll(base, 0o700); err != nil {
		notef("maas simulator: %v", err)
		return stop
	}
	if os.Getenv("GANTRY_NODEAGENT_PACKAGE") == "" {
		notef("maas simulator: building the node agent package (deploy/packaging) ...")
		deb, err := maastest.BuildAgentPackage(ctx, base)
		if err != nil {
			notef("maas simulator: not started: %v", err)
			return stop
		}
		os.Setenv("GANTRY_NODEAGENT_PACKAGE", deb)
		notef("maas simulator: the control plane serves %s", relPath(deb))
	}
	key, err := devMaasKey(filepath.Join(base, "api-key"))
	if err != nil {
		notef("maas simulator: not started: %v", err)
		return stop
	}
	machines := filepath.Join(base, "machines")
	_ = os.RemoveAll(machines) // sandboxes of an earlier run: their agents are gone
	logf, err := os.OpenFile(filepath.Join(dir, "logs", "maas-simulator.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		if err = os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err == nil {
			logf, err = os.OpenFile(filepath.Join(dir, "logs", "maas-simulator.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		}
		if err != nil {
			notef("maas simulator: not started: %v", err)
			return stop
		}
	}
	sim := maastest.New(maastest.Config{
		APIKeys: []string{key}, Durations: devMaasDurations,
		Booter: &maastest.AgentBooter{Dir: machines},
		Logger: slog.New(slog.NewTextHandler(logf, nil)),
	})
	for _, m := range devMaasMachines {
		sim.AddMachine(m)
	}
	addr := os.Getenv("GANTRY_DEV_MAAS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:5240"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		sim.Close()
		logf.Close()
		notef("maas simulator: not started: listen on %s: %v (set GANTRY_DEV_MAAS_ADDR)", addr, err)
		return stop
	}
	url := "http://" + dialable(ln.Addr()) + "/MAAS"
	srv := &http.Server{Handler: sim.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			notef("maas simulator: %v", err)
		}
	}()
	envFile := filepath.Join(dir, "maas.env")
	if err := devenv.WriteEnvFile(envFile, "Written by `make dev` with GANTRY_DEV_MAAS=1: the simulated MAAS (docs/maas-simulator.md).", []devenv.Var{
		{Key: "GANTRY_DEV_MAAS_URL", Value: url},
		{Key: "GANTRY_DEV_MAAS_API_KEY", Value: key},
	}); err != nil {
		notef("maas simulator: write %s: %v", envFile, err)
	}
	var ids []string
	for _, m := range devMaasMachines {
		ids = append(ids, m.SystemID+" ("+m.Hostname+")")
	}
	notef("maas simulator: %s with %s; URL and API key in %s; machine sandboxes in %s", url, strings.Join(ids, ", "), relPath(envFile), relPath(machines))
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		sim.Close()
		logf.Close()
	}
}

// devMaasKey reads the simulator's API key from path, creating it on first use, so a
// site registered in the dev database keeps working across restarts.
func devMaasKey(path string) (string, error) {
	if b, err := os.ReadFile(path); err == nil {
		if k := strings.TrimSpace(string(b)); strings.Count(k, ":") == 2 {
			return k, nil
		}
	}
	k := maastest.NewAPIKey()
	if err := os.WriteFile(path, []byte(k+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("store the simulator's API key: %w", err)
	}
	return k, nil
}
