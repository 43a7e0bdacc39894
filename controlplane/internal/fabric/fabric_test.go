package fabric_test

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/fabric"
	"github.com/gantry-gpu/gantry/controlplane/internal/fabric/fabricdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/fabric/fabrictest"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"github.com/gantry-gpu/gantry/shared/ids"
)

func TestTransportChoice(t *testing.T) {
	fx := newFixture(t)
	cases := []struct {
		name       string
		disableUDP bool
		mode       fabricnet.Mode
		want       fabricnet.Transport
	}{
		{"auto prefers QUIC", false, fabricnet.ModeAuto, fabricnet.TransportQUIC},
		{"auto falls back to TCP when nothing answers on UDP", true, fabricnet.ModeAuto, fabricnet.TransportTCP},
		{"tcp forced", false, fabricnet.ModeTCP, fabricnet.TransportTCP},
		{"quic forced", false, fabricnet.ModeQUIC, fabricnet.TransportQUIC},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fx := fx.sub(t)
			cfg := fx.config("r" + string(rune('a'+i)))
			cfg.DisableUDP = tc.disableUDP
			srv, _ := fx.server(cfg)
			id, tok := fx.node()
			a, _ := fx.agent(srv, tok, tc.mode)
			c := waitConn(t, a)
			if c.Transport != tc.want {
				t.Fatalf("transport = %s, want %s", c.Transport, tc.want)
			}
			p, ok, err := srv.Presence(context.Background(), id)
			if err != nil || !ok || !p.Online || p.Transport != string(tc.want) || p.Replica != cfg.ReplicaID {
				t.Fatalf("presence = %+v, %v, %v", p, ok, err)
			}
			if got := fx.status(id); got != nodes.StatusOnline {
				t.Fatalf("status = %s", got)
			}
		})
	}
}

func TestSecondConnectionReplacesFirst(t *testing.T) {
	fx := newFixture(t)
	srvA, _ := fx.server(fx.config("a"))
	srvB, _ := fx.server(fx.config("b"))
	id, tok := fx.node()

	first, stopFirst := fx.agent(srvA, tok, fabricnet.ModeAuto)
	c1 := waitConn(t, first)

	// Same replica: the second tunnel replaces the first.
	second, stopSecond := fx.agent(srvA, tok, fabricnet.ModeTCP)
	c2 := waitConn(t, second)
	if !closedWithin(c1.Session.Done(), 10*time.Second) {
		t.Fatal("first tunnel still open after the second connected")
	}
	stopFirst()
	eventually(t, "one session", func() bool { return srvA.LocalSessions() == 1 })
	p, _, _ := srvA.Presence(context.Background(), id)
	if p.Transport != "tcp" {
		t.Fatalf("presence after replacement = %+v", p)
	}

	// Another replica: a tunnel there replaces the one here.
	third, _ := fx.agent(srvB, tok, fabricnet.ModeAuto)
	c3 := waitConn(t, third)
	if !closedWithin(c2.Session.Done(), 10*time.Second) {
		t.Fatal("tunnel on replica a still open after the node connected to replica b")
	}
	stopSecond()
	eventually(t, "replica a empty", func() bool { return srvA.LocalSessions() == 0 })
	if srvB.LocalSessions() != 1 {
		t.Fatalf("replica b holds %d sessions", srvB.LocalSessions())
	}
	eventually(t, "presence on b", func() bool {
		p, _, _ := srvA.Presence(context.Background(), id)
		return p.Replica == "b" && p.Online
	})
	if c3.Welcome.GetReplicaId() != "b" {
		t.Fatalf("welcome replica = %s", c3.Welcome.GetReplicaId())
	}
	if n := fx.dir.offline.Load(); n != 0 {
		t.Fatalf("replacements marked the node offline %d times", n)
	}
}

func TestTunnelSurvivesCutAndRestart(t *testing.T) {
	fx := newFixture(t)
	cfg := fx.config("a")
	cfg.StartupTTL = 3 * time.Second // on fx.clock, which moves only below
	srv, stop := fx.server(cfg)
	id, tok := fx.node()
	a, _ := fx.agent(srv, tok, fabricnet.ModeAuto)
	c1 := waitConn(t, a)

	// The connection is cut: the agent is back within its backoff bound.
	_ = c1.Session.Close("cut")
	c2 := waitConn(t, a)
	if c2.Welcome.GetSessionId() == c1.Welcome.GetSessionId() {
		t.Fatal("same session after a cut")
	}
	eventually(t, "one session after cut", func() bool { return srv.LocalSessions() == 1 })

	// The control plane restarts on the same address.
	cfg.Addr = srv.ListenAddr().String()
	stop()
	srv2, _ := fx.server(cfg)
	c3 := waitConn(t, a)
	if c3.Welcome.GetSessionId() == c2.Welcome.GetSessionId() {
		t.Fatal("same session after restart")
	}
	// Inside the startup window the node gets the long TTL.
	if ttl := c3.Welcome.GetHeartbeat().GetTtl().AsDuration(); ttl < cfg.StartupTTL {
		t.Fatalf("ttl right after restart = %s, want >= %s", ttl, cfg.StartupTTL)
	}
	if srv2.LocalSessions() != 1 {
		t.Fatalf("sessions = %d", srv2.LocalSessions())
	}
	if n := fx.dir.offline.Load(); n != 0 {
		t.Fatalf("node marked offline %d times across cut and restart", n)
	}
	if got := fx.status(id); got != nodes.StatusOnline {
		t.Fatalf("status = %s", got)
	}
	// After the window the TTL is the fleet-sized one (about 10 s on fx.clock), and
	// heartbeats keep the node online: the clock moves on by 4 s (the window ends), then
	// three times by 8 s, each time once a heartbeat stamped at the current time arrived
	// — 28 s in all, well past any TTL the node had, without an expiry.
	fx.clock.Advance(cfg.StartupTTL + time.Second)
	for range 3 {
		now := fx.clock.Now()
		eventually(t, "a heartbeat at "+now.String(), func() bool {
			p, ok, _ := srv2.Presence(context.Background(), id)
			return ok && p.Online && !p.LastHeartbeat.Before(now)
		})
		fx.clock.Advance(8 * time.Second)
	}
	eventually(t, "a heartbeat after the last advance", func() bool {
		p, _, _ := srv2.Presence(context.Background(), id)
		return !p.LastHeartbeat.Before(fx.clock.Now())
	})
	if got := fx.status(id); got != nodes.StatusOnline || fx.dir.offline.Load() != 0 || srv2.LocalSessions() != 1 {
		t.Fatalf("status after the startup window = %s (offline calls %d, sessions %d)", got, fx.dir.offline.Load(), srv2.LocalSessions())
	}
	if c := a.Current(); c == nil || c != c3.Session {
		t.Fatal("the session did not survive the end of the startup window")
	}
}

func TestRevokedTokenEndsTunnel(t *testing.T) {
	fx := newFixture(t)
	srv, _ := fx.server(fx.config("a"))
	fx.nodes.Disconnector = srv
	id, tok := fx.node()
	a, _ := fx.agent(srv, tok, fabricnet.ModeAuto)
	c := waitConn(t, a)

	if _, err := fx.nodes.RevokeToken(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(c.Session.Done(), 5*time.Second) {
		t.Fatal("tunnel still open after the token was revoked")
	}
	if !closedWithin(a.Refused, 10*time.Second) {
		t.Fatal("reconnect with the revoked token was not refused")
	}
	if got := fx.status(id); got != nodes.StatusOffline {
		t.Fatalf("status = %s", got)
	}
	if srv.LocalSessions() != 0 {
		t.Fatalf("sessions = %d", srv.LocalSessions())
	}
}

func TestOfflineAfterTTLOnlineOnReconnect(t *testing.T) {
	fx := newFixture(t)
	srv, _ := fx.server(fx.config("a"))
	id, tok := fx.node()
	a, _ := fx.agent(srv, tok, fabricnet.ModeAuto)
	c1 := waitConn(t, a)
	if got := fx.status(id); got != nodes.StatusOnline {
		t.Fatalf("status = %s", got)
	}
	// Heartbeats stop and the TTL passes (on fx.clock): the tunnel is ended and the node
	// marked offline, once.
	a.NoHeartbeats.Store(true)
	ttl := c1.Welcome.GetHeartbeat().GetTtl().AsDuration()
	if closedWithin(c1.Session.Done(), 500*time.Millisecond) {
		t.Fatal("tunnel ended before its TTL passed")
	}
	fx.clock.Advance(ttl + time.Second)
	if !closedWithin(c1.Session.Done(), 20*time.Second) {
		t.Fatal("tunnel without heartbeats not ended")
	}
	eventually(t, "offline", func() bool { return fx.dir.offline.Load() == 1 })
	// It comes back (the clock stands still: its new session does not expire): online
	// again, and offline only the once.
	a.NoHeartbeats.Store(false)
	waitConn(t, a)
	eventually(t, "online", func() bool { return fx.status(id) == nodes.StatusOnline })
	if n := fx.dir.offline.Load(); n != 1 {
		t.Fatalf("offline calls = %d, want 1", n)
	}
}

func TestHeartbeatsPersistOnlyChanges(t *testing.T) {
	fx := newFixture(t)
	srv, _ := fx.server(fx.config("a"))
	id, tok := fx.node()
	a, _ := fx.agent(srv, tok, fabricnet.ModeAuto, func(a *fabrictest.Agent) { a.HeartbeatOverride = 20 * time.Millisecond })
	waitConn(t, a)
	before, err := fx.nodes.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "30 heartbeats", func() bool { return a.Heartbeats() >= 30 })
	if on, off, inv := fx.dir.online.Load(), fx.dir.offline.Load(), fx.dir.connected.Load(); on != 1 || off != 0 || inv != 1 {
		t.Fatalf("directory calls online=%d offline=%d connected=%d, want 1 0 1", on, off, inv)
	}
	after, err := fx.nodes.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if !after.StatusChangedAt.Equal(*before.StatusChangedAt) || after.Status != nodes.StatusOnline {
		t.Fatalf("status row changed by heartbeats: %v -> %v", before.StatusChangedAt, after.StatusChangedAt)
	}
	// Presence still tracks the live heartbeat on the holding replica: move the clock
	// on, and the next heartbeat is the last one presence knows.
	fx.clock.Advance(time.Second)
	now := fx.clock.Now()
	eventually(t, "presence's last heartbeat at the current time", func() bool {
		p, _, _ := srv.Presence(context.Background(), id)
		return !p.LastHeartbeat.Before(now)
	})
}

func TestPresenceAndDispatchAcrossReplicas(t *testing.T) {
	fx := newFixture(t)
	srvA, _ := fx.server(fx.config("a"))
	srvB, _ := fx.server(fx.config("b"))
	id, tok := fx.node()
	a, _ := fx.agent(srvA, tok, fabricnet.ModeAuto)
	waitConn(t, a)
	ctx := context.Background()

	eventually(t, "presence on b", func() bool {
		p, ok, _ := srvB.Presence(ctx, id)
		return ok && p.Online && p.Replica == "a" && p.Transport == "quic"
	})
	all, err := srvB.AllPresence(ctx)
	if err != nil || !all[id].Online {
		t.Fatalf("AllPresence = %v, %v", all, err)
	}

	task := &fabricv1.TaskDispatch{TaskId: uuid.NewString(), Kind: "test.noop", Payload: []byte(`{}`), Attempt: 1}
	ack, err := srvB.Dispatch(ctx, id, task)
	if err != nil || ack.GetStatus() != fabricv1.TaskAckStatus_TASK_ACK_STATUS_ACCEPTED || ack.GetTaskId() != task.TaskId {
		t.Fatalf("forwarded dispatch = %v, %v", ack, err)
	}
	task.Attempt = 2
	ack, err = srvA.Dispatch(ctx, id, task)
	if err != nil || ack.GetStatus() != fabricv1.TaskAckStatus_TASK_ACK_STATUS_DUPLICATE {
		t.Fatalf("redelivered dispatch = %v, %v", ack, err)
	}
	if _, err := srvB.Dispatch(ctx, uuid.New(), task); !errors.Is(err, fabric.ErrNodeOffline) {
		t.Fatalf("dispatch to an unknown node: %v", err)
	}

	pre := &fabricv1.StreamPreamble{Kind: fabricv1.StreamKind_STREAM_KIND_TERMINAL, StreamId: uuid.NewString(),
		TerminalSize: &fabricv1.TerminalSize{Cols: 80, Rows: 24}}
	var held *fabric.NotHeldHereError
	if _, err := srvB.OpenStream(ctx, id, pre); !errors.As(err, &held) || held.Replica != "a" {
		t.Fatalf("OpenStream on b: %v", err)
	}
	conn, err := srvA.OpenStream(ctx, id, pre)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("echo = %q, %v", buf, err)
	}
	var refused *fabricnet.StreamRefusedError
	if _, err := srvA.OpenStream(ctx, id, &fabricv1.StreamPreamble{}); !errors.As(err, &refused) || refused.Code != "unsupported_kind" {
		t.Fatalf("refused stream: %v", err)
	}
}

func TestDisconnectAcrossReplicas(t *testing.T) {
	fx := newFixture(t)
	srvA, _ := fx.server(fx.config("a"))
	srvB, _ := fx.server(fx.config("b"))
	id, tok := fx.node()
	a, stopAgent := fx.agent(srvA, tok, fabricnet.ModeTCP)
	c := waitConn(t, a)
	eventually(t, "presence on b", func() bool { p, _, _ := srvB.Presence(context.Background(), id); return p.Online })

	if err := srvB.Disconnect(context.Background(), id, "test"); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(c.Session.Done(), 5*time.Second) {
		t.Fatal("tunnel on replica a not ended by Disconnect on replica b")
	}
	stopAgent()
	eventually(t, "offline", func() bool { return fx.status(id) == nodes.StatusOffline })
	eventually(t, "presence offline on b", func() bool { p, _, _ := srvB.Presence(context.Background(), id); return !p.Online })
}

func TestWrongTokenRefused(t *testing.T) {
	fx := newFixture(t)
	srv, _ := fx.server(fx.config("a"))
	_, tok := fx.node()
	a, _ := fx.agent(srv, tok[:len(tok)-2]+"AA", fabricnet.ModeAuto)
	if !closedWithin(a.Refused, 10*time.Second) {
		t.Fatal("wrong token not refused")
	}
	if srv.LocalSessions() != 0 {
		t.Fatal("session registered for a refused token")
	}
}

func TestPKIOneCAUnderConcurrentFirstStart(t *testing.T) {
	fx := newFixture(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	pkis := make([]*fabric.PKI, 4)
	errs := make([]error, 4)
	for i := range pkis {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pkis[i], errs[i] = fabric.LoadPKI(ctx, fx.deps.Pool, fx.deps.SealKey, []string{"localhost", "127.0.0.1"}, clock.Real{}, ids.V7{})
		}()
	}
	wg.Wait()
	for i := range pkis {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if string(pkis[i].CAPEM) != string(pkis[0].CAPEM) || !pkis[i].Server.Leaf.Equal(pkis[0].Server.Leaf) {
			t.Fatal("replicas got different CAs or server certificates")
		}
		// One CA, one QUIC stateless reset key: a replica restarted after a crash (or
		// another one on its address) resets the tunnels the first one held.
		if pkis[i].ResetKey != pkis[0].ResetKey {
			t.Fatal("replicas sharing a CA derived different stateless reset keys")
		}
	}
	if pkis[0].ResetKey == [32]byte{} {
		t.Fatal("no stateless reset key")
	}
	if _, err := pkis[0].Server.Leaf.Verify(x509VerifyOpts(pkis[0])); err != nil {
		t.Fatalf("server certificate does not chain to the CA: %v", err)
	}
	var cas, certs int
	_ = fx.deps.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM fabric_ca), (SELECT count(*) FROM fabric_server_certs)`).Scan(&cas, &certs)
	if cas != 1 || certs != 1 {
		t.Fatalf("rows: %d CAs, %d server certificates", cas, certs)
	}
	// The private keys are stored sealed, never as PEM/DER in the clear.
	row, err := fabricdb.New(fx.deps.Pool).GetCA(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(row.KeyEnc) < 60 || string(row.KeyEnc[:2]) == "0\x82" {
		t.Fatal("CA key does not look sealed")
	}
	// A wrong master key cannot open it.
	wrong := make([]byte, 32)
	if _, err := fabric.LoadPKI(ctx, fx.deps.Pool, wrong, []string{"localhost"}, clock.Real{}, ids.V7{}); err == nil {
		t.Fatal("PKI loaded with the wrong seal key")
	}
}
