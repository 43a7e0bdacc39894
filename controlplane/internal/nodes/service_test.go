package nodes_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes/probe"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
	"github.com/gantry-gpu/gantry/shared/nodetoken"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// fakeDialer stands in for the network: the nodes of these tests live on private
// addresses this machine does not have. Every dial "connects".
type fakeDialer struct {
	mu    sync.Mutex
	dials []string
}

func (d *fakeDialer) DialContext(_ context.Context, _, address string) (net.Conn, error) {
	d.mu.Lock()
	d.dials = append(d.dials, address)
	d.mu.Unlock()
	c1, c2 := net.Pipe()
	_ = c2.Close()
	return c1, nil
}

func (d *fakeDialer) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.dials)
}

type disconnects struct {
	mu    sync.Mutex
	calls []string
}

func (d *disconnects) Disconnect(_ context.Context, nodeID uuid.UUID, reason string) error {
	d.mu.Lock()
	d.calls = append(d.calls, nodeID.String()+" "+reason)
	d.mu.Unlock()
	return nil
}

func (d *disconnects) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.calls)
}

type fabricInfo struct{}

func (fabricInfo) CAPEM() []byte {
	return []byte("-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n")
}
func (fabricInfo) Addr() string { return "fabric.example.com:7443" }

type fixture struct {
	pool   *pgxpool.Pool
	svc    *nodes.Service
	clk    *clock.Manual
	dialer *fakeDialer
	disc   *disconnects
}

func setup(t testing.TB) *fixture {
	t.Helper()
	pool := testenv.NewDatabase(t, testenv.Template{Name: "controlplane", Version: db.SchemaVersion(), Migrate: db.Migrate, Configure: db.ConfigurePool, AppRole: db.AppRole})
	clk := clock.NewManual(t0)
	f := &fixture{pool: pool, clk: clk, dialer: &fakeDialer{}, disc: &disconnects{}}
	pr := probe.New(probe.Policy{}, time.Second)
	pr.Dialer, pr.Clock = f.dialer, clk
	f.svc = nodes.New(pool, clk, ids.V7{}, pr, nodes.Config{}, nil)
	f.svc.Disconnector, f.svc.Fabric = f.disc, fabricInfo{}
	return f
}

func (f *fixture) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// xmin is the transaction that last wrote the node row: it changes exactly when the row
// is written.
func (f *fixture) xmin(t *testing.T, table, where string, args ...any) string {
	t.Helper()
	var x string
	if err := f.pool.QueryRow(context.Background(), "SELECT string_agg(xmin::text, ',' ORDER BY xmin::text) FROM "+table+" WHERE "+where, args...).Scan(&x); err != nil {
		t.Fatal(err)
	}
	return x
}

func (f *fixture) node(t testing.TB, name, addr string) nodes.Node {
	t.Helper()
	n, err := f.svc.Create(context.Background(), nodes.Spec{Name: name, Address: addr})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// enrolled creates a node and enrolls it, returning the node and its token.
func (f *fixture) enrolled(t testing.TB, name, addr string) (nodes.Node, string) {
	t.Helper()
	ctx := context.Background()
	n := f.node(t, name, addr)
	et, err := f.svc.IssueEnrollmentToken(ctx, n.ID)
	if err != nil {
		t.Fatal(err)
	}
	e, err := f.svc.Enroll(ctx, et.Token, name+".example.com", "1.0.0")
	if err != nil {
		t.Fatal(err)
	}
	if e.NodeID != n.ID {
		t.Fatalf("enrolled %s, want %s", e.NodeID, n.ID)
	}
	return n, e.NodeToken
}

func wantCode(t *testing.T, err error, code apierr.Code, status int) {
	t.Helper()
	e, ok := apierr.As(err)
	if !ok || e.Code != code || e.HTTPStatus() != status {
		t.Fatalf("got %v, want %s (%d)", err, code, status)
	}
}

// dgxH100 is the inventory go-nvml's mock dgxh100 reports: 8 x NVIDIA H100 80GB HBM3,
// driver 550.54.15, CUDA 12.4, PCI bus ids 0000:0N:00.0.
func dgxH100(host string) fleet.Inventory {
	inv := fleet.Inventory{AgentVersion: "1.0.0", Hostname: host}
	for i := 0; i < 8; i++ {
		inv.GPUs = append(inv.GPUs, fleet.GPU{
			Index: i, UUID: fmt.Sprintf("GPU-%s-%d", host, i), Model: "NVIDIA H100 80GB HBM3",
			MemoryBytes: 81920 << 20, PCIBusID: fmt.Sprintf("0000:%02x:00.0", i),
			DriverVersion: "550.54.15", CUDAVersion: "12.4",
		})
	}
	return inv
}

func TestAuthenticateNode(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	n, tok := f.enrolled(t, "gpu-1", "10.0.0.1")
	if got, err := f.svc.AuthenticateNode(ctx, tok); err != nil || got != n.ID {
		t.Fatalf("own token: %v %v", got, err)
	}
	// Only the hash is stored.
	if f.count(t, `SELECT count(*) FROM node_tokens WHERE token_hash = sha256($1::bytea)`, []byte(tok)) != 1 ||
		f.count(t, `SELECT count(*) FROM node_tokens WHERE position($1::bytea in token_hash) > 0`, []byte(tok[40:])) != 0 {
		t.Fatal("the token is not stored as its SHA-256 only")
	}
	other, _ := f.enrolled(t, "gpu-2", "10.0.0.2")
	wrongSecret := tok[:len(tok)-43] + "A" + tok[len(tok)-42:]
	if wrongSecret == tok {
		wrongSecret = tok[:len(tok)-43] + "B" + tok[len(tok)-42:]
	}
	otherID := "gnt_" + uuidHex(other.ID) + tok[36:] // right secret, wrong node
	for name, bad := range map[string]string{
		"empty": "", "garbage": "not-a-token", "wrong secret": wrongSecret, "other node id": otherID,
		"unknown node": "gnt_" + uuidHex(uuid.New()) + tok[36:], "jwt": "eyJhbGciOi.eyJzdWIi.sig",
	} {
		if _, err := f.svc.AuthenticateNode(ctx, bad); !errors.Is(err, fleet.ErrUnauthenticated) {
			t.Errorf("%s: %v, want ErrUnauthenticated", name, err)
		}
	}

	// Rotation: the old token stops at once, the tunnel on it is ended.
	rotated, err := f.svc.RotateToken(ctx, n.ID, tok)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.AuthenticateNode(ctx, tok); !errors.Is(err, fleet.ErrUnauthenticated) {
		t.Fatalf("rotated-away token: %v", err)
	}
	if got, err := f.svc.AuthenticateNode(ctx, rotated); err != nil || got != n.ID {
		t.Fatalf("new token: %v %v", got, err)
	}
	if _, err := f.svc.RotateToken(ctx, n.ID, tok); err == nil {
		t.Fatal("rotated with a rotated-away token")
	}
	if f.disc.count() != 1 {
		t.Fatalf("disconnects %v, want one for the rotation", f.disc.calls)
	}

	// Admin revocation: refused at once, tunnel ended, audited once.
	revoked, err := f.svc.RevokeToken(ctx, n.ID)
	if err != nil || !revoked {
		t.Fatalf("revoke: %v %v", revoked, err)
	}
	if _, err := f.svc.AuthenticateNode(ctx, rotated); !errors.Is(err, fleet.ErrUnauthenticated) {
		t.Fatalf("revoked token: %v", err)
	}
	if f.disc.count() != 2 {
		t.Fatalf("disconnects %v", f.disc.calls)
	}
	if revoked, err := f.svc.RevokeToken(ctx, n.ID); err != nil || revoked {
		t.Fatalf("second revoke: %v %v", revoked, err)
	}
	if f.count(t, `SELECT count(*) FROM audit_events WHERE action = 'node.token.revoke'`) != 1 {
		t.Fatal("a revoke that changed nothing was audited")
	}
	_, err = f.svc.RevokeToken(ctx, uuid.New())
	wantCode(t, err, apierr.NodeNotFound, 404)

	// Re-enrolment replaces the previous token and ends its tunnel.
	et, _ := f.svc.IssueEnrollmentToken(ctx, other.ID)
	e, err := f.svc.Enroll(ctx, et.Token, "gpu-2b", "1.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if f.count(t, `SELECT count(*) FROM node_tokens WHERE node_id = $1 AND revoked_at IS NULL`, other.ID) != 1 ||
		f.count(t, `SELECT count(*) FROM node_tokens WHERE node_id = $1 AND revoke_reason = 'reenrolled'`, other.ID) != 1 {
		t.Fatal("re-enrolment did not replace the token")
	}
	if got, err := f.svc.AuthenticateNode(ctx, e.NodeToken); err != nil || got != other.ID {
		t.Fatal("re-enrolled token refused")
	}
}

func uuidHex(id uuid.UUID) string { return fmt.Sprintf("%x", id[:]) }

func TestEnrollmentTokens(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	n := f.node(t, "gpu-1", "10.0.0.1")
	et, err := f.svc.IssueEnrollmentToken(ctx, n.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !et.ExpiresAt.Equal(t0.Add(nodes.DefaultEnrollmentTokenTTL)) || len(et.Token) != 47 {
		t.Fatalf("token %+v", et)
	}
	if f.count(t, `SELECT count(*) FROM node_enrollment_tokens WHERE token_hash = sha256($1::bytea)`, []byte(et.Token)) != 1 {
		t.Fatal("enrollment token not stored hashed")
	}
	// Concurrent use: exactly one wins.
	const racers = 8
	var wg sync.WaitGroup
	results := make(chan error, racers)
	for i := 0; i < racers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := f.svc.Enroll(ctx, et.Token, "gpu-1", "1.0.0")
			results <- err
		}()
	}
	wg.Wait()
	close(results)
	ok := 0
	for err := range results {
		if err == nil {
			ok++
			continue
		}
		wantCode(t, err, apierr.TokenInvalid, 401)
	}
	if ok != 1 || f.count(t, `SELECT count(*) FROM node_tokens WHERE node_id = $1`, n.ID) != 1 {
		t.Fatalf("%d enrollments succeeded", ok)
	}
	// Used: invalid.
	_, err = f.svc.Enroll(ctx, et.Token, "gpu-1", "1.0.0")
	wantCode(t, err, apierr.TokenInvalid, 401)
	// Expired: token_expired, nothing written.
	et2, _ := f.svc.IssueEnrollmentToken(ctx, n.ID)
	f.clk.Advance(nodes.DefaultEnrollmentTokenTTL)
	_, err = f.svc.Enroll(ctx, et2.Token, "gpu-1", "1.0.0")
	wantCode(t, err, apierr.TokenExpired, 401)
	// A newer token supersedes an older unused one.
	a, _ := f.svc.IssueEnrollmentToken(ctx, n.ID)
	b, _ := f.svc.IssueEnrollmentToken(ctx, n.ID)
	_, err = f.svc.Enroll(ctx, a.Token, "gpu-1", "1.0.0")
	wantCode(t, err, apierr.TokenExpired, 401)
	if _, err := f.svc.Enroll(ctx, b.Token, "gpu-1", "1.0.0"); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "gne_short", "gnt_" + et.Token[4:], et.Token + "x"} {
		_, err = f.svc.Enroll(ctx, bad, "gpu-1", "1.0.0")
		wantCode(t, err, apierr.TokenInvalid, 401)
	}
	_, err = f.svc.IssueEnrollmentToken(ctx, uuid.New())
	wantCode(t, err, apierr.NodeNotFound, 404)
	if f.count(t, `SELECT count(*) FROM node_tokens WHERE node_id = $1 AND revoked_at IS NULL`, n.ID) != 1 {
		t.Fatal("more than one live token")
	}
}

func TestNodeStatusWritesOnlyOnChange(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	n, _ := f.enrolled(t, "gpu-1", "10.0.0.1")
	events := func() int { return f.count(t, `SELECT count(*) FROM outbox_events WHERE event_type LIKE 'node.o%'`) }

	x0 := f.xmin(t, "nodes", "id = $1", n.ID)
	if err := f.svc.NodeStatus(ctx, n.ID, true, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	x1 := f.xmin(t, "nodes", "id = $1", n.ID)
	if x1 == x0 || events() != 1 {
		t.Fatal("going online was not written")
	}
	for i := 0; i < 5; i++ { // heartbeats repeating the persisted state
		if err := f.svc.NodeStatus(ctx, n.ID, true, t0.Add(time.Duration(2+i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if f.xmin(t, "nodes", "id = $1", n.ID) != x1 || events() != 1 {
		t.Fatal("a repeated online status wrote the row")
	}
	got, _ := f.svc.Get(ctx, n.ID)
	if got.Status != nodes.StatusOnline || !got.LastSeenAt.Equal(t0.Add(time.Second)) || !got.StatusChangedAt.Equal(t0.Add(time.Second)) {
		t.Fatalf("node %+v", got.Node)
	}
	if err := f.svc.NodeStatus(ctx, n.ID, false, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	x2 := f.xmin(t, "nodes", "id = $1", n.ID)
	if err := f.svc.NodeStatus(ctx, n.ID, false, t0.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if x2 == x1 || f.xmin(t, "nodes", "id = $1", n.ID) != x2 || events() != 2 {
		t.Fatal("offline transition not written exactly once")
	}
	if err := f.svc.NodeStatus(ctx, uuid.New(), true, t0); !errors.Is(err, nodes.ErrUnknownNode) {
		t.Fatalf("unknown node: %v", err)
	}
}

func TestNodeConnectedWritesOnlyChanges(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	n, _ := f.enrolled(t, "gpu-1", "10.0.0.1")
	inv := dgxH100("gpu-1")
	if err := f.svc.NodeConnected(ctx, n.ID, inv, t0); err != nil {
		t.Fatal(err)
	}
	audits := func() int {
		return f.count(t, `SELECT count(*) FROM audit_events WHERE action = 'node.inventory.update'`)
	}
	if audits() != 1 || f.count(t, `SELECT count(*) FROM node_gpus WHERE node_id = $1`, n.ID) != 8 {
		t.Fatal("first hello not stored")
	}
	xn, xg := f.xmin(t, "nodes", "id = $1", n.ID), f.xmin(t, "node_gpus", "node_id = $1", n.ID)
	for i := 0; i < 3; i++ { // reconnects with the same inventory
		if err := f.svc.NodeConnected(ctx, n.ID, dgxH100("gpu-1"), t0.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	if f.xmin(t, "nodes", "id = $1", n.ID) != xn || f.xmin(t, "node_gpus", "node_id = $1", n.ID) != xg || audits() != 1 {
		t.Fatal("an unchanged hello wrote something")
	}
	// A new agent version: only the node row; a GPU gone: only that row.
	inv = dgxH100("gpu-1")
	inv.AgentVersion = "1.1.0"
	inv.GPUs = inv.GPUs[:7]
	if err := f.svc.NodeConnected(ctx, n.ID, inv, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	got, _ := f.svc.Get(ctx, n.ID)
	if *got.AgentVersion != "1.1.0" || len(got.GPUs) != 1 || got.GPUs[0].Count != 7 || audits() != 2 {
		t.Fatalf("after change: %+v", got)
	}
	if f.xmin(t, "node_gpus", "node_id = $1", n.ID) == xg {
		t.Fatal("gpu rows not touched")
	}
	if f.count(t, `SELECT count(DISTINCT xmin::text) FROM node_gpus WHERE node_id = $1`, n.ID) != 1 {
		t.Fatal("the remaining GPUs were rewritten")
	}
	bad := dgxH100("gpu-1")
	bad.GPUs = append(bad.GPUs, bad.GPUs[0])
	if err := f.svc.NodeConnected(ctx, n.ID, bad, t0); !errors.Is(err, nodes.ErrInvalidInventory) {
		t.Fatalf("duplicate GPU uuid: %v", err)
	}
	if err := f.svc.NodeConnected(ctx, uuid.New(), inv, t0); !errors.Is(err, nodes.ErrUnknownNode) {
		t.Fatalf("unknown node: %v", err)
	}
}

func samples(inv fleet.Inventory, at time.Time, util uint32) []fleet.GPUMetrics {
	out := make([]fleet.GPUMetrics, len(inv.GPUs))
	for i, g := range inv.GPUs {
		out[i] = fleet.GPUMetrics{
			UUID: g.UUID, UtilizationPercent: util, MemoryUsedBytes: 1 << 30, TemperatureC: 40,
			PowerMilliwatts: 300000, Healthy: true, SampledAt: at,
		}
	}
	return out
}

func TestNodeTelemetryCoalesces(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	n, _ := f.enrolled(t, "gpu-1", "10.0.0.1")
	inv := dgxH100("gpu-1")
	if err := f.svc.NodeConnected(ctx, n.ID, inv, t0); err != nil {
		t.Fatal(err)
	}
	util := func() int {
		return f.count(t, `SELECT utilization_percent FROM node_gpus WHERE node_id = $1 AND gpu_index = 0`, n.ID)
	}
	if err := f.svc.NodeTelemetry(ctx, n.ID, samples(inv, t0, 10)); err != nil {
		t.Fatal(err)
	}
	x := f.xmin(t, "node_gpus", "node_id = $1", n.ID)
	f.clk.Advance(5 * time.Second)
	if err := f.svc.NodeTelemetry(ctx, n.ID, samples(inv, f.clk.Now(), 20)); err != nil {
		t.Fatal(err)
	}
	if util() != 10 || f.xmin(t, "node_gpus", "node_id = $1", n.ID) != x {
		t.Fatal("a routine sample inside the interval was written")
	}
	// A health change is written at once.
	s := samples(inv, f.clk.Now(), 30)
	s[3].Healthy = false
	if err := f.svc.NodeTelemetry(ctx, n.ID, s); err != nil {
		t.Fatal(err)
	}
	if util() != 30 || f.count(t, `SELECT count(*) FROM node_gpus WHERE node_id = $1 AND healthy = false`, n.ID) != 1 {
		t.Fatal("health change not written")
	}
	// XIDs are written at once and accumulate.
	s = samples(inv, f.clk.Now(), 31)
	s[3].Healthy = false
	s[3].XIDErrors = []uint64{79, 48}
	if err := f.svc.NodeTelemetry(ctx, n.ID, s); err != nil {
		t.Fatal(err)
	}
	if f.count(t, `SELECT xid_errors_total FROM node_gpus WHERE node_id = $1 AND gpu_index = 3`, n.ID) != 2 ||
		f.count(t, `SELECT last_xid FROM node_gpus WHERE node_id = $1 AND gpu_index = 3`, n.ID) != 48 {
		t.Fatal("xid not stored")
	}
	// After the interval a routine sample is written again; the last XID is kept.
	f.clk.Advance(nodes.DefaultTelemetryMinInterval)
	s = samples(inv, f.clk.Now(), 40)
	s[3].Healthy = false
	if err := f.svc.NodeTelemetry(ctx, n.ID, s); err != nil {
		t.Fatal(err)
	}
	if util() != 40 || f.count(t, `SELECT last_xid FROM node_gpus WHERE node_id = $1 AND gpu_index = 3`, n.ID) != 48 {
		t.Fatal("routine sample after the interval not written")
	}
	// Unknown GPUs are ignored.
	if err := f.svc.NodeTelemetry(ctx, n.ID, []fleet.GPUMetrics{{UUID: "GPU-unknown", Healthy: true}}); err != nil {
		t.Fatal(err)
	}
}

func TestFleetTotalsDGXH100(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	const model = "NVIDIA H100 80GB HBM3"
	a, _ := f.enrolled(t, "dgx-a", "10.0.0.1")
	b, _ := f.enrolled(t, "dgx-b", "10.0.0.2")
	c, _ := f.enrolled(t, "dgx-c", "10.0.0.3")
	for _, n := range []nodes.Node{a, b, c} {
		if err := f.svc.NodeConnected(ctx, n.ID, dgxH100(n.Name), t0); err != nil {
			t.Fatal(err)
		}
	}
	// a: online, schedulable, one unhealthy GPU, two allocated. b: online but cordoned.
	// c: offline.
	for _, n := range []nodes.Node{a, b} {
		if err := f.svc.NodeStatus(ctx, n.ID, true, t0); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.svc.NodeStatus(ctx, c.ID, false, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.ChangeSchedule(ctx, b.ID, nodes.ActionCordon); err != nil {
		t.Fatal(err)
	}
	s := samples(dgxH100("dgx-a"), t0, 50)
	s[7].Healthy = false
	if err := f.svc.NodeTelemetry(ctx, a.ID, s); err != nil {
		t.Fatal(err)
	}
	f.svc.Allocations = heldGPUs{a.ID: {"GPU-dgx-a-0", "GPU-dgx-a-1"}}

	v, err := f.svc.Fleet(ctx, uuid.Nil, 50)
	if err != nil {
		t.Fatal(err)
	}
	want := nodes.ModelTotals{Model: model, Total: 24, Allocated: 2, Unhealthy: 1, Free: 5, Unavailable: 16}
	if len(v.Totals) != 1 || v.Totals[0] != want {
		t.Fatalf("totals %+v, want %+v", v.Totals, want)
	}
	if len(v.Nodes) != 3 || v.More {
		t.Fatalf("%d nodes", len(v.Nodes))
	}
	for _, fn := range v.Nodes {
		if len(fn.GPUs) != 8 {
			t.Fatalf("%s: %d gpus", fn.Name, len(fn.GPUs))
		}
		if fn.ID == a.ID && (!fn.GPUs[0].Allocated || fn.GPUs[7].Healthy.Bool || fn.GPUs[0].UtilizationPercent.Int32 != 50 ||
			fn.GPUs[0].MemoryBytes != 85899345920 || fn.GPUs[0].DriverVersion != "550.54.15" || fn.GPUs[0].CudaVersion != "12.4") {
			t.Fatalf("node a gpus %+v", fn.GPUs[:1])
		}
		if fn.LastHeartbeat == nil || !fn.LastHeartbeat.Equal(t0) {
			t.Fatalf("%s: last heartbeat %v", fn.Name, fn.LastHeartbeat)
		}
	}
	// Live presence supplies the heartbeat and transport.
	hb := t0.Add(42 * time.Second)
	f.svc.Presence = presence{a.ID: {NodeID: a.ID, Online: true, LastHeartbeat: hb, Transport: "quic"}}
	// Pages: totals stay fleet-wide.
	v, err = f.svc.Fleet(ctx, uuid.Nil, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Nodes) != 2 || !v.More || v.Totals[0] != want {
		t.Fatalf("page 1: %d nodes more=%v totals %+v", len(v.Nodes), v.More, v.Totals)
	}
	for _, fn := range v.Nodes {
		if fn.ID == a.ID && (fn.Transport != "quic" || !fn.LastHeartbeat.Equal(hb)) {
			t.Fatalf("presence not used: %+v", fn)
		}
	}
	v2, err := f.svc.Fleet(ctx, v.Nodes[1].ID, 2)
	if err != nil || len(v2.Nodes) != 1 || v2.More {
		t.Fatalf("page 2: %v %+v", err, v2)
	}
}

type heldGPUs map[uuid.UUID][]string

func (h heldGPUs) AllocatedGPUs(context.Context) (map[uuid.UUID][]string, error) { return h, nil }
func (h heldGPUs) NodeInUse(_ context.Context, id uuid.UUID) (bool, error) {
	return len(h[id]) > 0, nil
}

type presence map[uuid.UUID]fleet.Presence

func (p presence) Presence(_ context.Context, id uuid.UUID) (fleet.Presence, bool, error) {
	v, ok := p[id]
	return v, ok, nil
}
func (p presence) AllPresence(context.Context) (map[uuid.UUID]fleet.Presence, error) { return p, nil }

// BenchmarkAuthenticateNode is one fabric handshake's (or node REST call's) token check:
// parse, one indexed read of the live token, a constant-time compare. Baseline in the
// same run: the parse + verify alone, without the database.
func BenchmarkAuthenticateNode(b *testing.B) {
	f := setup(b)
	ctx := context.Background()
	_, tok := f.enrolled(b, "gpu-1", "10.0.0.1")
	b.Run("baseline-verify-only", func(b *testing.B) {
		h := nodetoken.Hash(tok)
		for b.Loop() {
			if !nodetoken.Verify(tok, h) {
				b.Fatal("refused")
			}
		}
	})
	b.Run("authenticate", func(b *testing.B) {
		for b.Loop() {
			if _, err := f.svc.AuthenticateNode(ctx, tok); err != nil {
				b.Fatal(err)
			}
		}
	})
}
