package maas_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/maas/maastest"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

// The whole onboarding, in one test, with nothing standing in for the node: a Ready
// machine is onboarded through the API; MAAS (the simulator) deploys it with the
// control plane's cloud-init user data, which it validates with `cloud-init schema` and
// runs in a sandbox: the bootstrap fetches the agent .deb built from this repository
// and its checksum from the control plane (GANTRY_NODEAGENT_PACKAGE), unpacks it and
// enrolls; the unpacked gantry-nodeagent then connects over the fabric and reports the
// machine's 8 mock H100s. The onboarding succeeds with the node online, uncordoned and
// allocatable, and an allocation placed on it becomes active: the agent provisioned it.
func TestOnboardingToActiveAllocationWithTheRealAgent(t *testing.T) {
	for _, bin := range []string{"cloud-init", "dpkg-deb", "curl", "sha256sum"} {
		_, err := exec.LookPath(bin)
		ci.SkipUnlessAvailable(t, bin, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	start := time.Now()
	phase := func(what string) { t.Logf("%s after %s", what, time.Since(start).Round(time.Millisecond)) }
	deb, err := maastest.BuildAgentPackage(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	phase("agent package built")
	// The control plane is served on a listener taken first, so that its URL can go in
	// the configuration the user data is rendered from.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bootDir := t.TempDir()
	f := newFixture(t, fixtureOpts{
		runJobs: true,
		booter: func(*apitest.Env) maastest.Booter {
			return &maastest.AgentBooter{Dir: bootDir, StopTimeout: 30 * time.Second}
		},
		config: func(c *app.Config) {
			c.Maas.ControlPlaneURL = "http://" + ln.Addr().String()
			c.Maas.PackagePath = deb
			c.Fabric.StartupTTL = 10 * time.Second
		},
	})
	srv := &http.Server{Handler: f.e.App.Handler, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	// The fabric the agent connects to, the outbox relay and the provisioning dispatcher
	// that hands the allocation to the agent (what App.Run runs beside the API).
	bg, stopBG := context.WithCancel(context.Background())
	done := make(chan struct{}, 3)
	go func() { _ = f.e.App.Fabric.Run(bg); done <- struct{}{} }()
	go func() { _ = f.e.App.Relay.Run(bg); done <- struct{}{} }()
	go func() { _ = f.e.App.Provisioning.Run(bg); done <- struct{}{} }()
	t.Cleanup(func() { stopBG(); <-done; <-done; <-done })
	phase("control plane up")

	sys := f.sim.AddMachine(maastest.MachineSpec{Hostname: "gpu-real-1"})
	r := f.onboard(t, sys)
	if r.StatusCode() != http.StatusAccepted {
		t.Fatalf("onboard: %d %s", r.StatusCode(), r.Body)
	}
	var o api.MaasOnboarding
	waitUntil(t, ctx, f, sys, "onboarding succeeded", func() bool {
		g, err := f.admin.GetMaasOnboardingWithResponse(ctx, r.JSON202.ID, &api.GetMaasOnboardingParams{})
		if err != nil || g.JSON200 == nil {
			t.Fatalf("get onboarding: %v", err)
		}
		o = *g.JSON200
		if o.State == api.MaasWorkflowStateFailed {
			t.Fatalf("onboarding failed at %s: %s", deref(o.CurrentStep), deref(o.FailureReason))
		}
		return o.State == api.MaasWorkflowStateSucceeded
	})
	phase("onboarding succeeded")
	m, _ := f.sim.Machine(sys)
	if !m.Booted || m.BootError != "" {
		t.Fatalf("the machine did not boot the agent: %+v", m)
	}
	n, err := f.admin.GetNodeWithResponse(ctx, *o.NodeID, &api.GetNodeParams{})
	if err != nil || n.JSON200 == nil {
		t.Fatalf("node: %v", err)
	}
	node := *n.JSON200
	if node.Status != api.NodeStatusOnline || node.ScheduleState != api.NodeScheduleStateSchedulable || len(node.Gpus) != 1 || node.Gpus[0].Count != 8 {
		t.Fatalf("node after onboarding: %s %s %+v, want online, schedulable, 8 GPUs", node.Status, node.ScheduleState, node.Gpus)
	}

	alice, alloc := placeAllocation(t, f, node.ID)
	waitUntil(t, ctx, f, sys, "allocation active on the onboarded node", func() bool {
		g, err := alice.GetAllocationWithResponse(ctx, alloc.ID, &api.GetAllocationParams{XProjectID: alloc.ProjectID})
		if err != nil || g.JSON200 == nil {
			t.Fatalf("get allocation: %v", err)
		}
		if g.JSON200.Status == "failed" {
			t.Fatalf("allocation failed: %+v", g.JSON200)
		}
		return g.JSON200.Status == "active" && g.JSON200.NodeID == node.ID
	})
	phase("allocation active")
}

// waitUntil polls cond until it holds; at the bound it fails with the machine's boot logs.
func waitUntil(t *testing.T, ctx context.Context, f *fixture, sys, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			m, _ := f.sim.Machine(sys)
			logs := ""
			for _, name := range []string{"var/log/cloud-init-output.log", "var/log/gantry-nodeagent.log"} {
				b, _ := os.ReadFile(filepath.Join(m.BootDir, name))
				logs += "\n--- " + name + ":\n" + tail(string(b), 3000)
			}
			t.Fatalf("%s: not within the bound; machine %+v%s", what, m, logs)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
