package e2e_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/nodeagent/agent"
	"github.com/gantry-gpu/gantry/nodeagent/enroll"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// TestAgentEnrollsConnectsAndReportsMockDGXH100 is enrollment end to end: an admin
// creates a node and mints an enrollment token, the agent enrolls (config, 0600 token,
// fabric CA on disk), connects, and the node shows online in fleet telemetry with the
// mock DGX H100's eight GPUs and their metrics.
func TestAgentEnrollsConnectsAndReportsMockDGXH100(t *testing.T) {
	c := startCP(t)
	nodeID, token := c.newNode("gpu-h100-01")
	e := c.enrollAgent(token, "gpu-h100-01.example")
	if e.nodeID != nodeID {
		t.Fatalf("enrolled as %s, created %s", e.nodeID, nodeID)
	}
	fi, err := os.Stat(e.cfg.Resolve(e.cfg.TokenFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", err, fi)
	}

	// The enrollment token was one-time.
	_, err = enroll.Call(context.Background(), c.env.HTTPClient(), c.url, enroll.Request{EnrollmentToken: token, Hostname: "again", AgentVersion: "e2e-1.0"})
	var refused *enroll.Error
	if !errors.As(err, &refused) || refused.Status != 401 {
		t.Fatalf("second enrollment with the same token: %v", err)
	}

	r := c.runAgent(e, nil)
	eventually(t, "node online with 8 GPUs and metrics", func() bool {
		n, ok := c.fleetNode(nodeID)
		if !ok || n.Status != api.NodeStatusOnline || len(n.Gpus) != 8 {
			return false
		}
		for _, g := range n.Gpus {
			if g.Metrics == nil {
				return false
			}
		}
		return true
	})
	inv, err := r.mock.Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	f := c.fleet()
	n, _ := c.fleetNode(nodeID)
	if n.AgentVersion == nil || *n.AgentVersion != "e2e-1.0" || n.Hostname == nil || *n.Hostname != "gpu-h100-01.example" ||
		n.Transport == nil || *n.Transport != "quic" || n.LastHeartbeatAt == nil {
		t.Fatalf("fleet node = %+v", n)
	}
	for i, g := range n.Gpus {
		want := inv.GPUs[i]
		if g.UUID != want.UUID || g.Index != i || g.Model != "NVIDIA H100 80GB HBM3" || g.MemoryBytes != 80<<30 ||
			g.PciBusID != want.PCIBusID || g.DriverVersion != "550.54.15" || g.CudaVersion != "12.4" || g.MigEnabled || g.Allocated {
			t.Errorf("gpu %d = %+v, want %+v", i, g, want)
		}
		if g.Healthy == nil || !*g.Healthy || g.Metrics.TemperatureC != 30+i%4 || g.Metrics.PowerMilliwatts != int64(69_000+1_000*i) ||
			g.Metrics.UtilizationPercent != 0 || g.Metrics.EccErrorsUncorrected != 0 {
			t.Errorf("gpu %d health/metrics = %v %+v", i, g.Healthy, g.Metrics)
		}
	}
	var h100 *api.FleetGPUModelTotals
	for i := range f.Totals {
		if f.Totals[i].Model == "NVIDIA H100 80GB HBM3" {
			h100 = &f.Totals[i]
		}
	}
	if h100 == nil || h100.Total != 8 || h100.Allocated != 0 || h100.Unhealthy != 0 || h100.Free+h100.Unavailable != 8 {
		t.Fatalf("totals = %+v", f.Totals)
	}
	if st := r.Status(); !st.Connected || st.NodeID != nodeID.String() || st.Transport != "quic" {
		t.Fatalf("agent status %+v", st)
	}

	// A load change reaches the fleet view on the next telemetry sample.
	r.mock.SetLoad(5, 93, 70<<30)
	r.mock.InjectXID(7, 79)
	eventually(t, "load and XID in fleet telemetry", func() bool {
		n, _ := c.fleetNode(nodeID)
		g5, g7 := n.Gpus[5], n.Gpus[7]
		return g5.Metrics != nil && g5.Metrics.UtilizationPercent == 93 && g5.Metrics.MemoryUsedBytes == 70<<30 &&
			g7.Healthy != nil && !*g7.Healthy && g7.Metrics.LastXid != nil && *g7.Metrics.LastXid == 79
	})
}

// TestTunnelSurvivesCutAndControlPlaneRestart cuts the agent's connection and then
// restarts the control plane: the agent comes back each time, every wait it chose stays
// within the backoff bound, and the control plane holds exactly one session for the
// node afterwards.
func TestTunnelSurvivesCutAndControlPlaneRestart(t *testing.T) {
	c := startCP(t)
	nodeID, token := c.newNode("gpu-flaky-01")
	e := c.enrollAgent(token, "gpu-flaky-01")
	cutter := newTCPCutter(t, c.app.Fabric.ListenAddr().String())
	e.cfg.FabricAddr = cutter.addr() // the fabric certificate names 127.0.0.1: TLS still verifies
	e.cfg.Transport = "tcp"
	r := c.runAgent(e, nil)
	backoff := agent.Backoff{Min: 100 * time.Millisecond, Max: 2 * time.Second} // what runAgent configures

	online := func(sessions int) func() bool {
		return func() bool {
			st := r.Status()
			if !st.Connected || st.Sessions != sessions || c.app.Fabric.LocalSessions() != 1 {
				return false
			}
			p, ok, err := c.app.Fabric.Presence(context.Background(), nodeID)
			return err == nil && ok && p.Online && p.Transport == "tcp"
		}
	}
	eventually(t, "first tunnel", online(1))

	// The durations are logged for the report, never asserted (the machine is shared).
	cutAt := time.Now()
	cutter.cut()
	eventually(t, "tunnel back after the cut", online(2))
	t.Logf("back %v after the cut", time.Since(cutAt).Round(time.Millisecond))

	restartAt := time.Now()
	c.restart()
	eventually(t, "tunnel back after the control plane restarted", online(3))
	t.Logf("back %v after the restart began (includes assembling the new control plane)", time.Since(restartAt).Round(time.Millisecond))
	eventually(t, "node online in the restarted control plane's fleet view", func() bool {
		n, ok := c.fleetNode(nodeID)
		return ok && n.Status == api.NodeStatusOnline && len(n.Gpus) == 8
	})

	delays := r.retryDelays()
	if len(delays) < 2 {
		t.Fatalf("expected at least 2 reconnect waits, got %v", delays)
	}
	for _, d := range delays {
		if d < backoff.Min/2 || d > backoff.Max {
			t.Fatalf("reconnect wait %v outside [%v, %v]: %v", d, backoff.Min/2, backoff.Max, delays)
		}
	}
	if r.Executions() != 0 {
		t.Fatal("no task was dispatched, yet something executed")
	}
}

// TestAgentFallsBackToTCPWhenUDPIsBlocked: with nothing answering on UDP, transport
// auto ends up on TLS+yamux over TCP, and the fleet view says so.
func TestAgentFallsBackToTCPWhenUDPIsBlocked(t *testing.T) {
	c := startCP(t, apitest.WithConfig(func(cfg *app.Config) { cfg.Fabric.DisableUDP = true }))
	nodeID, token := c.newNode("gpu-tcp-01")
	e := c.enrollAgent(token, "gpu-tcp-01")
	if e.cfg.Transport != "auto" {
		t.Fatalf("transport %q", e.cfg.Transport)
	}
	r := c.runAgent(e, func(o *agent.Options) {
		o.DialOptions = &fabricnet.DialOptions{QUICFallbackAfter: 500 * time.Millisecond}
	})
	eventually(t, "online over tcp", func() bool {
		n, ok := c.fleetNode(nodeID)
		return ok && n.Status == api.NodeStatusOnline && n.Transport != nil && *n.Transport == "tcp"
	})
	if st := r.Status(); st.Transport != "tcp" {
		t.Fatalf("agent transport %q", st.Transport)
	}
}

// TestAgentShutsDownCleanly: cancelling the agent (what SIGTERM does in the binary)
// returns nil, closes the tunnel, and the control plane drops the session.
func TestAgentShutsDownCleanly(t *testing.T) {
	c := startCP(t)
	_, token := c.newNode("gpu-stop-01")
	e := c.enrollAgent(token, "gpu-stop-01")
	r := c.runAgent(e, nil)
	eventually(t, "connected", func() bool { return r.Status().Connected && c.app.Fabric.LocalSessions() == 1 })
	if err := r.stop(t); err != nil {
		t.Fatalf("Run returned %v", err)
	}
	if st := r.Status(); st.Connected {
		t.Fatalf("still connected: %+v", st)
	}
	eventually(t, "session gone on the control plane", func() bool { return c.app.Fabric.LocalSessions() == 0 })
}

// TestRevokedNodeTokenIsRefusedUntilReEnrolled: an admin revokes the node token, the
// tunnel ends and reconnects are refused; re-enrolling with a new enrollment token (the
// config directory is rewritten, as the install script does) brings the same agent
// process back without a restart.
func TestRevokedNodeTokenIsRefusedUntilReEnrolled(t *testing.T) {
	c := startCP(t)
	nodeID, token := c.newNode("gpu-revoke-01")
	e := c.enrollAgent(token, "gpu-revoke-01")
	r := c.runAgent(e, nil)
	eventually(t, "connected", func() bool { return r.Status().Connected })

	res, err := c.client().RevokeNodeTokenWithResponse(context.Background(), nodeID, &api.RevokeNodeTokenParams{})
	if err != nil || res.StatusCode() >= 300 {
		t.Fatalf("revoke: %v %d %s", err, res.StatusCode(), res.Body)
	}
	eventually(t, "tunnel refused after revocation", func() bool {
		st := r.Status()
		return !st.Connected && st.Attempts >= 1 && strings.Contains(st.LastError, "refused")
	})

	tok, err := c.client().CreateNodeEnrollmentTokenWithResponse(context.Background(), nodeID, &api.CreateNodeEnrollmentTokenParams{})
	if err != nil || tok.JSON201 == nil {
		t.Fatalf("new enrollment token: %v", err)
	}
	res2, err := enroll.Call(context.Background(), c.env.HTTPClient(), c.url, enroll.Request{EnrollmentToken: tok.JSON201.EnrollmentToken, Hostname: "gpu-revoke-01", AgentVersion: "e2e-1.0"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := enroll.Apply(e.cfg, c.url, res2); err != nil {
		t.Fatal(err)
	}
	eventually(t, "connected again with the new token", func() bool { return r.Status().Connected })
	if uuid.MustParse(res2.NodeID) != nodeID {
		t.Fatalf("re-enrolled as %s", res2.NodeID)
	}
}
