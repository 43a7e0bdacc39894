package fabric_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/fabric"
	"github.com/gantry-gpu/gantry/nodeagent/agent"
	"github.com/gantry-gpu/gantry/nodeagent/gpu"
	"github.com/gantry-gpu/gantry/nodeagent/storagemount"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// whoAmI is a raw stream kind the tests register: the handler answers with the node
// its context carries (fabric.NodeID), as a StorageObjectInfo frame's path.
var whoAmI = fabricnet.AgentStreamKind{0, 't', 'w', 'h'}

func serveWhoAmI(ctx context.Context, st net.Conn) {
	var req fabricv1.StorageStatRequest
	if err := fabricnet.ReadFrame(st, &req); err != nil {
		return
	}
	id, ok := fabric.NodeID(ctx)
	if !ok {
		_ = fabricnet.WriteReply(st, &fabricv1.StreamReply{Ok: false, ErrorCode: "UNAUTHENTICATED"})
		return
	}
	if fabricnet.WriteReply(st, &fabricv1.StreamReply{Ok: true}) == nil {
		_ = fabricnet.WriteFrame(st, &fabricv1.StorageObjectInfo{Path: id.String()})
	}
}

func (fx *fixture) clientTLS(srv *fabric.Server) *tls.Config {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(srv.CAPEM())
	return &tls.Config{RootCAs: pool}
}

// mainTunnel dials a QUIC tunnel as an agent does and authenticates it.
func (fx *fixture) mainTunnel(srv *fabric.Server, token string) (fabricnet.Session, *fabricv1.AuthResponse) {
	fx.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := fabricnet.Dial(ctx, srv.ListenAddr().String(), fabricnet.ModeQUIC, fx.clientTLS(srv), nil)
	if err != nil {
		fx.t.Fatal(err)
	}
	fx.t.Cleanup(func() { _ = s.Close("test over") })
	res, err := fabricnet.Authenticate(ctx, s, &fabricv1.AuthRequest{Token: token})
	if err != nil {
		fx.t.Fatal(err)
	}
	return s, res
}

// sideAuth dials a TLS+TCP tunnel and authenticates it as a bulk side session of
// forID; it returns the session (nil when refused) and the error code.
func (fx *fixture) sideAuth(srv *fabric.Server, token, forID string) (fabricnet.Session, string) {
	fx.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := fabricnet.Dial(ctx, srv.ListenAddr().String(), fabricnet.ModeTCP, fx.clientTLS(srv), nil)
	if err != nil {
		fx.t.Fatal(err)
	}
	res, err := fabricnet.Authenticate(ctx, s, &fabricv1.AuthRequest{Token: token, BulkForSessionId: forID})
	if err != nil {
		_ = s.Close("refused")
		if res == nil {
			fx.t.Fatalf("side session auth: %v", err)
		}
		return nil, res.GetErrorCode()
	}
	fx.t.Cleanup(func() { _ = s.Close("test over") })
	return s, ""
}

func whoAmIOn(t *testing.T, s fabricnet.Session) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := fabricnet.OpenAgentStream(ctx, s, whoAmI, &fabricv1.StorageStatRequest{})
	if err != nil {
		return "", err
	}
	defer st.Close()
	_ = st.SetDeadline(time.Now().Add(20 * time.Second))
	var info fabricv1.StorageObjectInfo
	if err := fabricnet.ReadFrame(st, &info); err != nil {
		return "", err
	}
	return info.GetPath(), nil
}

// TestBulkSideSession: a main tunnel is told side sessions are offered; a side session
// naming it with the node's token is served raw streams as the main session's (the
// handler sees the node) and counted; gRPC on it is refused; a side session naming an
// unknown, malformed or another node's session, or naming this node's session with
// another node's token, is refused with session_not_found (a bad token with
// token_invalid); a newer side session replaces the older; the side session ends
// with its main session.
func TestBulkSideSession(t *testing.T) {
	fx := newFixture(t)
	srv, _ := fx.server(fx.config("a"), func(s *fabric.Server) { s.HandleRawStream(whoAmI, serveWhoAmI) })
	idA, tokA := fx.node()
	_, tokB := fx.node()
	mainA, resA := fx.mainTunnel(srv, tokA)
	if !resA.GetBulkSideSessions() {
		t.Fatal("the main tunnel's AuthResponse does not offer bulk side sessions")
	}
	_, resB := fx.mainTunnel(srv, tokB)

	side, code := fx.sideAuth(srv, tokA, resA.GetSessionId())
	if side == nil {
		t.Fatalf("side session refused: %s", code)
	}
	if side.Transport() != fabricnet.TransportTCP {
		t.Fatalf("side session over %s", side.Transport())
	}
	if got, err := whoAmIOn(t, side); err != nil || got != idA.String() {
		t.Fatalf("raw stream on the side session served as %q (%v), want node %s", got, err, idA)
	}
	if n := srv.BulkStreams(); n != 1 {
		t.Fatalf("BulkStreams = %d, want 1", n)
	}
	if got, err := whoAmIOn(t, mainA); err != nil || got != idA.String() {
		t.Fatalf("raw stream on the main tunnel: %q %v", got, err)
	}
	if n := srv.BulkStreams(); n != 1 {
		t.Fatalf("BulkStreams = %d after a main-tunnel stream, want 1", n)
	}
	if n := srv.LocalSessions(); n != 2 {
		t.Fatalf("LocalSessions = %d with a side session up, want 2", n)
	}

	// gRPC on the side session: the stream is closed, the call fails.
	cc, err := fabricnet.GRPCClient(side)
	if err != nil {
		t.Fatal(err)
	}
	gctx, gcancel := context.WithTimeout(context.Background(), 20*time.Second)
	ctl, err := fabricv1.NewFabricClient(cc).Control(gctx)
	if err == nil {
		_, err = ctl.Recv()
	}
	gcancel()
	_ = cc.Close()
	if err == nil || errors.Is(gctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("gRPC Control on a side session: %v (context %v), want refused", err, gctx.Err())
	}

	for _, tc := range []struct {
		name, token, forID, want string
	}{
		{"unknown session id", tokA, uuid.NewString(), fabricnet.AuthErrSessionNotFound},
		{"malformed session id", tokA, "not-a-uuid", fabricnet.AuthErrSessionNotFound},
		{"another node's session", tokA, resB.GetSessionId(), fabricnet.AuthErrSessionNotFound},
		{"another node's token", tokB, resA.GetSessionId(), fabricnet.AuthErrSessionNotFound},
		{"bad token", "gnt_not-a-token", resA.GetSessionId(), fabricnet.AuthErrTokenInvalid},
	} {
		if s, code := fx.sideAuth(srv, tc.token, tc.forID); s != nil || code != tc.want {
			t.Errorf("%s: side session %v, code %q, want refused with %q", tc.name, s != nil, code, tc.want)
		}
	}
	if got, err := whoAmIOn(t, side); err != nil || got != idA.String() {
		t.Fatalf("the side session after the refusals: %q %v", got, err)
	}

	// A newer side session replaces the older.
	side2, code := fx.sideAuth(srv, tokA, resA.GetSessionId())
	if side2 == nil {
		t.Fatalf("second side session refused: %s", code)
	}
	if !closedWithin(side.Done(), 10*time.Second) {
		t.Fatal("the replaced side session is still open")
	}
	if got, err := whoAmIOn(t, side2); err != nil || got != idA.String() {
		t.Fatalf("raw stream on the newer side session: %q %v", got, err)
	}

	// The main session ends: its side session ends with it, and a side session naming
	// it is refused from then on.
	_ = mainA.Close("agent gone")
	if !closedWithin(side2.Done(), 10*time.Second) {
		t.Fatal("the side session outlived its main session")
	}
	eventually(t, "main session gone", func() bool { return srv.LocalSessions() == 1 })
	if s, code := fx.sideAuth(srv, tokA, resA.GetSessionId()); s != nil || code != fabricnet.AuthErrSessionNotFound {
		t.Fatalf("side session of an ended session: %v %q", s != nil, code)
	}
}

// bulkConnAuth dials a bulk connection naming forID; it returns the connection (nil
// when refused) and the error code.
func (fx *fixture) bulkConnAuth(srv *fabric.Server, token, forID string) (fabricnet.Session, string) {
	fx.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := fabricnet.DialBulkConn(ctx, srv.ListenAddr().String(), fx.clientTLS(srv), nil, &fabricv1.AuthRequest{Token: token, BulkForSessionId: forID})
	if err != nil {
		var code string
		for _, c := range []string{fabricnet.AuthErrSessionNotFound, fabricnet.AuthErrTokenInvalid} {
			if strings.Contains(err.Error(), c) || (c == fabricnet.AuthErrTokenInvalid && errors.Is(err, fabricnet.ErrTokenRefused)) {
				code = c
			}
		}
		if code == "" {
			fx.t.Fatalf("bulk connection: %v", err)
		}
		return nil, code
	}
	fx.t.Cleanup(func() { _ = s.Close("test over") })
	return s, ""
}

// TestBulkConn: a main tunnel (QUIC or TLS+TCP) is told bulk connections are taken; a
// bulk connection naming it with the node's token serves one raw stream as the main
// session's (the handler sees the node), counted, several at once; its connection ends
// with the stream; one naming an unknown, malformed or another node's session, or with
// another node's token or a bad one, is refused, and so is one naming no session (it is
// never a tunnel of its own); a gRPC stream on one is closed unserved; bulk connections
// end with their main session.
func TestBulkConn(t *testing.T) {
	fx := newFixture(t)
	srv, _ := fx.server(fx.config("bc"), func(s *fabric.Server) { s.HandleRawStream(whoAmI, serveWhoAmI) })
	idA, tokA := fx.node()
	_, tokB := fx.node()
	mainA, resA := fx.mainTunnel(srv, tokA)
	if !resA.GetBulkConnections() {
		t.Fatal("the main tunnel's AuthResponse does not offer bulk connections")
	}
	_, resB := fx.mainTunnel(srv, tokB)

	var conns []fabricnet.Session
	for range 3 {
		c, code := fx.bulkConnAuth(srv, tokA, resA.GetSessionId())
		if c == nil {
			t.Fatalf("bulk connection refused: %s", code)
		}
		if !fabricnet.IsBulkConn(c) {
			t.Fatal("DialBulkConn returned something else than a bulk connection")
		}
		conns = append(conns, c)
	}
	if got, err := whoAmIOn(t, conns[0]); err != nil || got != idA.String() {
		t.Fatalf("raw stream on a bulk connection served as %q (%v), want node %s", got, err, idA)
	}
	if n := srv.BulkStreams(); n != 1 {
		t.Fatalf("BulkStreams = %d, want 1", n)
	}
	// whoAmIOn closed its stream: that was the connection.
	if !closedWithin(conns[0].Done(), 10*time.Second) {
		t.Fatal("the bulk connection outlived its stream")
	}
	if _, err := conns[0].OpenStream(context.Background()); err == nil {
		t.Fatal("a second stream opened on a bulk connection")
	}
	if n := srv.LocalSessions(); n != 2 {
		t.Fatalf("LocalSessions = %d with bulk connections up, want 2", n)
	}

	// gRPC's preface on a bulk connection: closed unserved.
	st, err := conns[1].OpenStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_ = st.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := st.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	if n, err := st.Read(make([]byte, 64)); err == nil {
		t.Fatalf("gRPC preface on a bulk connection answered with %d bytes", n)
	}

	for _, tc := range []struct {
		name, token, forID, want string
	}{
		{"unknown session id", tokA, uuid.NewString(), fabricnet.AuthErrSessionNotFound},
		{"malformed session id", tokA, "not-a-uuid", fabricnet.AuthErrSessionNotFound},
		{"another node's session", tokA, resB.GetSessionId(), fabricnet.AuthErrSessionNotFound},
		{"another node's token", tokB, resA.GetSessionId(), fabricnet.AuthErrSessionNotFound},
		{"bad token", "gnt_not-a-token", resA.GetSessionId(), fabricnet.AuthErrTokenInvalid},
	} {
		if c, code := fx.bulkConnAuth(srv, tc.token, tc.forID); c != nil || code != tc.want {
			t.Errorf("%s: bulk connection %v, code %q, want refused with %q", tc.name, c != nil, code, tc.want)
		}
	}

	// A bulk connection naming no session (DialBulkConn will not send one): refused,
	// not served as a tunnel.
	tc, err := tls.Dial("tcp", srv.ListenAddr().String(), &tls.Config{RootCAs: fx.clientTLS(srv).RootCAs, NextProtos: []string{fabricnet.ALPNBulk}, MinVersion: tls.VersionTLS13})
	if err != nil {
		t.Fatal(err)
	}
	_ = tc.SetDeadline(time.Now().Add(20 * time.Second))
	if err := fabricnet.WriteFrame(tc, &fabricv1.AuthRequest{Token: tokA, ProtocolVersion: fabricnet.ProtocolVersion}); err != nil {
		t.Fatal(err)
	}
	var res fabricv1.AuthResponse
	if err := fabricnet.ReadFrame(tc, &res); err != nil || res.GetOk() || res.GetErrorCode() != fabricnet.AuthErrSessionNotFound {
		t.Fatalf("bulk connection without a session: %v %v, want refused with %s", &res, err, fabricnet.AuthErrSessionNotFound)
	}
	_ = tc.Close()
	if n := srv.LocalSessions(); n != 2 {
		t.Fatalf("LocalSessions = %d after a bulk connection without a session, want 2", n)
	}

	// The main session ends: its bulk connections end with it, and new ones are refused.
	_ = mainA.Close("agent gone")
	// The agent's end learns of it when it reads: the control plane closed it.
	st, err = conns[2].OpenStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_ = st.SetDeadline(time.Now().Add(15 * time.Second))
	var ne net.Error
	if _, err = st.Read(make([]byte, 1)); err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("a bulk connection outlived its main session: read %v", err)
	}
	eventually(t, "main session gone", func() bool { return srv.LocalSessions() == 1 })
	if c, code := fx.bulkConnAuth(srv, tokA, resA.GetSessionId()); c != nil || code != fabricnet.AuthErrSessionNotFound {
		t.Fatalf("bulk connection of an ended session: %v %q", c != nil, code)
	}
}

// rangeServer is the test's AgentStreamStorageRead handler: synthetic objects of any
// size named by the attachment ("size"), served only to node, counting ranges.
type rangeServer struct {
	node   uuid.UUID
	size   int64
	ranges atomic.Int64
}

func synthByte(i int64) byte { return byte(i*131 + i>>13) }

func (rs *rangeServer) serve(ctx context.Context, st net.Conn) {
	for {
		_ = st.SetReadDeadline(time.Now().Add(30 * time.Second))
		var req fabricv1.StorageReadRequest
		if err := fabricnet.ReadFrame(st, &req); err != nil {
			return
		}
		if id, ok := fabric.NodeID(ctx); !ok || id != rs.node {
			_ = fabricnet.WriteReply(st, &fabricv1.StreamReply{Ok: false, ErrorCode: "PERMISSION_DENIED"})
			continue
		}
		rs.ranges.Add(1)
		off := min(req.GetOffset(), rs.size)
		end := rs.size
		if n := req.GetLength(); n > 0 {
			end = min(end, off+n)
		}
		if fabricnet.WriteReply(st, &fabricv1.StreamReply{Ok: true}) != nil ||
			fabricnet.WriteFrame(st, &fabricv1.StorageObjectInfo{Path: req.GetPath(), Size: rs.size, Etag: `"e"`}) != nil {
			return
		}
		buf := make([]byte, 64<<10)
		for off < end {
			n := min(int64(len(buf)), end-off)
			for i := range n {
				buf[i] = synthByte(off + i)
			}
			if _, err := st.Write(buf[:n]); err != nil {
				return
			}
			off += n
		}
	}
}

// TestAgentBulkReads: the real agent (nodeagent/agent) with storagemount's client
// reads a whole object over raw streams. On either transport the reads move to bulk
// connections once the first is up (the server counts them), and a connection serves
// read after read (fewer TCP dials than reads); where TCP is blocked (the dial fails)
// they stay on the QUIC tunnel, with the same bytes, and the dial is not retried on
// every read.
func TestAgentBulkReads(t *testing.T) {
	const size = 6<<20 + 4321
	want := make([]byte, size)
	for i := range want {
		want[i] = synthByte(int64(i))
	}
	cases := []struct {
		name       string
		mode       fabricnet.Mode
		blockTCP   bool
		wantSide   bool
		wantDials  int
		wantFailed int
	}{
		{"quic", fabricnet.ModeQUIC, false, true, 1, 0},
		{"quic, tcp blocked", fabricnet.ModeQUIC, true, false, 1, 1},
		{"tcp", fabricnet.ModeTCP, false, true, 1, 0},
	}
	fx := newFixture(t)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fx := fx.sub(t)
			rs := &rangeServer{size: size}
			srv, _ := fx.server(fx.config("r"+string(rune('a'+i))), func(s *fabric.Server) {
				s.HandleRawStream(fabricnet.AgentStreamStorageRead, rs.serve)
			})
			id, tok := fx.node()
			rs.node = id
			var tcpDials atomic.Int64
			dial := &fabricnet.DialOptions{DialTCP: func(ctx context.Context, addr string) (net.Conn, error) {
				tcpDials.Add(1)
				if tc.blockTCP {
					return nil, errors.New("tcp blocked on this path")
				}
				var d net.Dialer
				return d.DialContext(ctx, "tcp", addr)
			}}
			backend, err := gpu.Open(gpu.BackendMockH100, gpu.Options{MockSeed: id.String()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { backend.Close() })
			conns := storagemount.NewConns()
			a, err := agent.New(agent.Options{
				Addr: srv.ListenAddr().String(), Transport: tc.mode, TLS: fx.clientTLS(srv), DialOptions: dial,
				Token: func() (string, error) { return tok, nil }, AgentVersion: "test/1", Hostname: "gpu-bulk", GPU: backend,
				OnTunnel: conns.SetTunnel, Backoff: agent.Backoff{Min: 50 * time.Millisecond, Max: 500 * time.Millisecond},
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = a.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-done })
			eventually(t, "agent connected", func() bool { return a.Status().Connected })

			c := storagemount.NewClient(conns)
			read := func() {
				t.Helper()
				r, err := c.Open(context.Background(), uuid.NewString(), "big.bin", 0, 0, "")
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(r)
				r.Close()
				if err != nil || len(got) != size || string(got) != string(want) {
					t.Fatalf("read %d bytes (%v): not the object's", len(got), err)
				}
			}
			read() // the first read starts the side session's dial
			if tc.wantSide {
				eventually(t, "side session up", func() bool { return conns.BulkStats().Up })
			}
			before := srv.BulkStreams()
			for range 3 {
				read()
			}
			if got := srv.BulkStreams() - before; tc.wantSide != (got > 0) {
				t.Fatalf("%d raw streams on side sessions over 3 reads, want side: %v", got, tc.wantSide)
			}
			if !tc.wantSide && srv.BulkStreams() != 0 {
				t.Fatalf("BulkStreams = %d without a side session", srv.BulkStreams())
			}
			if st := conns.BulkStats(); st.Dials != tc.wantDials || st.Failures != tc.wantFailed {
				t.Fatalf("bulk stats %+v, want %d dials, %d failed", st, tc.wantDials, tc.wantFailed)
			}
			if rs.ranges.Load() < 4 {
				t.Fatalf("%d ranges served raw, want >= 4", rs.ranges.Load())
			}
			bulkDials := tcpDials.Load()
			if tc.mode == fabricnet.ModeTCP {
				bulkDials-- // the tunnel itself
			}
			// The probe's connection serves the first read after it and stays for the
			// next (one more if it sat unused past its 5 s), so 3 reads dial at most 2.
			if bulkDials < int64(tc.wantDials) || bulkDials > 2 {
				t.Fatalf("%d TCP dials for bulk connections over 3 reads, want %d..2", bulkDials, tc.wantDials)
			}
		})
	}
}
