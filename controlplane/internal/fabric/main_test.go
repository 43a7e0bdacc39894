package fabric_test

import (
	"context"
	"crypto/rand"
	"fmt"
	rnd "math/rand/v2"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/fabric"
	"github.com/gantry-gpu/gantry/controlplane/internal/fabric/fabrictest"
	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes/probe"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"github.com/gantry-gpu/gantry/shared/ids"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

// TestMain fails the package when a goroutine outlives the tests: servers, sessions and
// agents that do not end are what a replica would pile up with every reconnect. The check
// runs after testenv.Shutdown, so the throwaway services it may have started are gone.
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Shutdown()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines left after the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// countingDirectory is the real nodes Directory, counting what the fabric asks of it.
type countingDirectory struct {
	fleet.Directory
	online, offline, connected, telemetry atomic.Int64
}

func (d *countingDirectory) NodeStatus(ctx context.Context, id uuid.UUID, online bool, at time.Time) error {
	if online {
		d.online.Add(1)
	} else {
		d.offline.Add(1)
	}
	return d.Directory.NodeStatus(ctx, id, online, at)
}

func (d *countingDirectory) NodeConnected(ctx context.Context, id uuid.UUID, inv fleet.Inventory, at time.Time) error {
	d.connected.Add(1)
	return d.Directory.NodeConnected(ctx, id, inv, at)
}

func (d *countingDirectory) NodeTelemetry(ctx context.Context, id uuid.UUID, s []fleet.GPUMetrics) error {
	d.telemetry.Add(1)
	return d.Directory.NodeTelemetry(ctx, id, s)
}

type fixture struct {
	t *testing.T
	// clock is the servers' clock (deps.Clock). It moves only when a test advances it, so
	// no heartbeat TTL runs out because a loaded machine delayed a heartbeat; the tests
	// of expiry and of the startup window advance it past the TTL they examine.
	clock   *clock.Manual
	deps    fabric.Deps
	nodes   *nodes.Service
	dir     *countingDirectory
	bucket  string
	subject string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool := testenv.NewDatabase(t, testenv.Template{Name: "controlplane", Version: db.SchemaVersion(), Migrate: db.Migrate, Configure: db.ConfigurePool, AppRole: db.AppRole})
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ns := testenv.Namespace(t)
	bucket := "fabric_presence_" + ns
	testenv.CleanupKV(t, js, bucket)
	svc := nodes.New(pool, clock.Real{}, ids.V7{}, probe.New(probe.Policy{}, 50*time.Millisecond), nodes.Config{}, nil)
	dir := &countingDirectory{Directory: svc}
	seal := make([]byte, 32)
	_, _ = rand.Read(seal)
	clk := clock.NewManual(time.Now())
	return &fixture{
		t: t, nodes: svc, dir: dir, bucket: bucket, subject: "test." + ns + ".fabric.", clock: clk,
		deps: fabric.Deps{Pool: pool, SealKey: seal, NATS: nc, JS: js, Directory: dir, Clock: clk, IDs: ids.V7{}},
	}
}

// config shrinks every interval so tests run in seconds. The tickers run on real time
// (heartbeats every 100-125 ms, sweeps every 50 ms); the TTLs are read on fx.clock, where
// the grace makes a TTL of about 10 s that passes only when a test advances the clock.
func (fx *fixture) config(replica string) fabric.Config {
	return fabric.Config{
		Addr: "127.0.0.1:0", ReplicaID: replica, Bucket: fx.bucket, SubjectPrefix: fx.subject,
		MinHeartbeatInterval: 100 * time.Millisecond, MaxHeartbeatsPerSecond: 1e6,
		HeartbeatGrace: 10 * time.Second, StartupTTL: 300 * time.Millisecond,
		SweepInterval: 50 * time.Millisecond, PresenceRefresh: 200 * time.Millisecond,
		ReplicaRefresh: 200 * time.Millisecond, DispatchTimeout: 5 * time.Second,
	}
}

// server starts a fabric server; stop ends it (Run returns) and is also a cleanup.
// setup runs between New and Run (HandleRawStream, RegisterService).
func (fx *fixture) server(cfg fabric.Config, setup ...func(*fabric.Server)) (*fabric.Server, func()) {
	fx.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := fabric.New(ctx, cfg, fx.deps)
	if err != nil {
		cancel()
		fx.t.Fatal(err)
	}
	for _, f := range setup {
		f(srv)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Run(ctx) }()
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := srv.WaitPresence(wctx); err != nil {
		fx.t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	fx.t.Cleanup(stop)
	return srv, stop
}

// node creates and enrolls a node; it returns its id and bearer token.
func (fx *fixture) node() (uuid.UUID, string) {
	fx.t.Helper()
	ctx := context.Background()
	n, err := fx.nodes.Create(ctx, nodes.Spec{Name: "gpu-" + uuid.NewString()[:8], Address: fmt.Sprintf("10.%d.%d.%d", rnd.IntN(256), rnd.IntN(256), 1+rnd.IntN(254))})
	if err != nil {
		fx.t.Fatal(err)
	}
	et, err := fx.nodes.IssueEnrollmentToken(ctx, n.ID)
	if err != nil {
		fx.t.Fatal(err)
	}
	en, err := fx.nodes.Enroll(ctx, et.Token, "sim", "sim/1")
	if err != nil {
		fx.t.Fatal(err)
	}
	return n.ID, en.NodeToken
}

// agent starts a simulated agent against srv; it stops when the test ends.
func (fx *fixture) agent(srv *fabric.Server, token string, mode fabricnet.Mode, opts ...func(*fabrictest.Agent)) (*fabrictest.Agent, context.CancelFunc) {
	a := fabrictest.NewAgent(srv.ListenAddr().String(), token, srv.CAPEM(), mode)
	a.BackoffMin, a.BackoffMax = 50*time.Millisecond, 500*time.Millisecond
	a.Dial = &fabricnet.DialOptions{QUICFallbackAfter: 300 * time.Millisecond}
	for _, o := range opts {
		o(a)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	fx.t.Cleanup(func() { cancel(); <-done })
	return a, cancel
}

func (fx *fixture) status(id uuid.UUID) string {
	fx.t.Helper()
	n, err := fx.nodes.Get(context.Background(), id)
	if err != nil {
		fx.t.Fatal(err)
	}
	return n.Status
}

// waitConn waits for the agent's next session.
func waitConn(t *testing.T, a *fabrictest.Agent) fabrictest.Connection {
	t.Helper()
	select {
	case c := <-a.Sessions:
		return c
	case <-time.After(20 * time.Second):
		t.Fatal("agent did not connect")
	}
	return fabrictest.Connection{}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func closedWithin(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// sub is fx for a subtest (failures reported on t).
func (fx *fixture) sub(t *testing.T) *fixture {
	c := *fx
	c.t = t
	return &c
}
