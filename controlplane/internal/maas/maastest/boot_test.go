package maastest_test

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/canonical/gomaasclient/client"
	"github.com/canonical/gomaasclient/entity"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/maas/maastest"
	"github.com/gantry-gpu/gantry/controlplane/internal/maas/packages"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	cloudinit "github.com/gantry-gpu/gantry/deploy/cloud-init"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/testenv"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestAgentBootEnrollsOverTheFabric deploys a simulated machine with the user data of
// deploy/cloud-init against a real control plane: the simulator validates it with
// `cloud-init schema`, runs its bootstrap in a sandbox (package and checksum fetched from
// the control plane, dpkg-deb -x, enrollment), starts the unpacked agent on mock H100s,
// and the node comes online over the fabric with its 8 GPUs. Release stops the agent
// and the node goes offline.
func TestAgentBootEnrollsOverTheFabric(t *testing.T) {
	for _, bin := range []string{"cloud-init", "dpkg-deb", "curl", "sha256sum"} {
		_, err := exec.LookPath(bin)
		ci.SkipUnlessAvailable(t, bin, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	began := time.Now()
	deb, err := maastest.BuildAgentPackage(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("agent package built in %s", time.Since(began).Round(time.Millisecond))

	// A stopped agent's tunnel is "lost": presence keeps the node online for its TTL,
	// which for a freshly started replica is StartupTTL (5 minutes by default).
	env := apitest.New(t, apitest.WithConfig(func(c *app.Config) {
		c.Fabric.StartupTTL = 10 * time.Second
	}))
	t.Logf("control plane up at +%s", time.Since(began).Round(time.Millisecond))
	fabricCtx, stopFabric := context.WithCancel(context.Background())
	fabricDone := make(chan struct{})
	go func() {
		defer close(fabricDone)
		if err := env.App.Fabric.Run(fabricCtx); err != nil {
			t.Errorf("fabric: %v", err)
		}
	}()
	t.Cleanup(func() { stopFabric(); <-fabricDone })

	// The control plane as a deployed machine reaches it: the API, plus the package
	// endpoints served by maas/packages.
	pkg := packages.New(deb)
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+cloudinit.PackagePath, func(w http.ResponseWriter, r *http.Request) {
		res, err := pkg.GetNodeAgentPackage(r.Context(), api.GetNodeAgentPackageRequestObject{})
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_ = res.VisitGetNodeAgentPackageResponse(w)
	})
	mux.HandleFunc("GET "+cloudinit.ChecksumPath, func(w http.ResponseWriter, r *http.Request) {
		res, err := pkg.GetNodeAgentPackageChecksum(r.Context(), api.GetNodeAgentPackageChecksumRequestObject{})
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_ = res.VisitGetNodeAgentPackageChecksumResponse(w)
	})
	mux.Handle("/", env.App.Handler)
	cp := httptest.NewServer(mux)
	t.Cleanup(cp.Close)

	node, err := env.App.Nodes.Create(ctx, nodes.Spec{Name: "gpu-maas-1", Address: "10.30.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := env.App.Nodes.IssueEnrollmentToken(ctx, node.ID)
	if err != nil {
		t.Fatal(err)
	}
	ud, err := cloudinit.UserData(cloudinit.Params{ControlPlaneURL: cp.URL, EnrollmentToken: tok.Token, Hostname: "gpu-maas-1"})
	if err != nil {
		t.Fatal(err)
	}

	sim := maastest.New(maastest.Config{Booter: &maastest.AgentBooter{Dir: t.TempDir(), StopTimeout: 30 * time.Second}})
	url := sim.Start(false)
	t.Cleanup(sim.Close)
	id := sim.AddMachine(maastest.MachineSpec{Hostname: "gpu-maas-1"})
	c, err := client.GetClientWithTransport(url, sim.APIKey(), "2.0", &http.Transport{ResponseHeaderTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Machines.Allocate(&entity.MachineAllocateParams{SystemID: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Machine.Deploy(id, &entity.MachineDeployParams{UserData: ud}); err != nil {
		t.Fatal(err)
	}
	if err := sim.WaitStatus(ctx, id, maastest.StatusDeployed); err != nil {
		t.Fatal(err)
	}
	deployed := time.Now()

	var got nodes.Node
	waitFor(t, ctx, sim, id, "node online with 8 GPUs", func() bool {
		n, err := env.App.Nodes.Get(ctx, node.ID)
		if err != nil {
			t.Fatal(err)
		}
		got = n
		return n.Status == nodes.StatusOnline && len(n.GPUs) == 1 && n.GPUs[0].Count == 8
	})
	t.Logf("node online %s after Deployed", time.Since(deployed).Round(time.Millisecond))
	if !strings.Contains(got.GPUs[0].Model, "H100") {
		t.Errorf("GPU model %q", got.GPUs[0].Model)
	}
	m, _ := sim.Machine(id)
	if !m.Booted || m.BootError != "" {
		t.Fatalf("machine %+v", m)
	}
	if _, err := os.Stat(filepath.Join(m.BootDir, "etc/gantry/enrollment-token")); !os.IsNotExist(err) {
		t.Errorf("the enrollment token is still on the machine (%v)", err)
	}
	conf, err := os.ReadFile(filepath.Join(m.BootDir, "etc/gantry/nodeagent.conf"))
	if err != nil || !strings.Contains(string(conf), node.ID.String()) {
		t.Errorf("agent config %q: %v", conf, err)
	}

	// Release: the machine powers off, the agent stops, the node goes offline.
	if _, err := c.Machine.Release(id, &entity.MachineReleaseParams{Erase: true, QuickErase: true}); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	waitFor(t, ctx, sim, id, "node offline after release", func() bool {
		n, err := env.App.Nodes.Get(ctx, node.ID)
		return err == nil && n.Status != nodes.StatusOnline
	})
	t.Logf("node offline %s after release", time.Since(released).Round(time.Millisecond))
}

// TestAgentBootRejectsInvalidUserData: user data that `cloud-init schema` rejects is
// never run; the machine is Deployed (MAAS does not check user data) with a boot error.
func TestAgentBootRejectsInvalidUserData(t *testing.T) {
	_, err := exec.LookPath("cloud-init")
	ci.SkipUnlessAvailable(t, "cloud-init", err)
	sim := maastest.New(maastest.Config{Booter: &maastest.AgentBooter{Dir: t.TempDir()}})
	url := sim.Start(false)
	t.Cleanup(sim.Close)
	id := sim.AddMachine(maastest.MachineSpec{})
	c, err := client.GetClient(url, sim.APIKey(), "2.0")
	if err != nil {
		t.Fatal(err)
	}
	bad := "#cloud-config\nwrite_files: 7\nruncmd:\n  - [touch, /tmp/maastest-must-not-run]\n"
	if _, err := c.Machine.Deploy(id, &entity.MachineDeployParams{UserData: base64.StdEncoding.EncodeToString([]byte(bad))}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	waitFor(t, ctx, sim, id, "boot error", func() bool { m, _ := sim.Machine(id); return m.BootError != "" })
	m, _ := sim.Machine(id)
	if m.Status != maastest.StatusDeployed || m.Booted || !strings.Contains(m.BootError, "cloud-init schema") {
		t.Fatalf("machine %+v", m)
	}
	if _, err := os.Stat(filepath.Join(m.BootDir, "tmp/maastest-must-not-run")); !os.IsNotExist(err) {
		t.Fatal("runcmd ran")
	}
}

func waitFor(t *testing.T, ctx context.Context, sim *maastest.Server, id, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			m, _ := sim.Machine(id)
			logs := ""
			for _, f := range []string{"var/log/cloud-init-output.log", "var/log/gantry-nodeagent.log"} {
				b, _ := os.ReadFile(filepath.Join(m.BootDir, f))
				logs += "\n--- " + f + ":\n" + tail(string(b), 3000)
			}
			t.Fatalf("%s: not within the deadline; machine %+v%s", what, m, logs)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
