package fabric_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
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
// reads a whole object over raw streams. On a QUIC tunnel the reads move to a bulk
// side session once it is up (the server counts them); where TCP is blocked (the side
// session's dial fails) they stay on the QUIC tunnel, with the same bytes, and the dial
// is not retried on every read; on a TLS+TCP tunnel there is no side session.
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
		{"tcp", fabricnet.ModeTCP, false, false, 0, 0},
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
			wantTCP := int64(tc.wantDials)
			if tc.mode == fabricnet.ModeTCP {
				wantTCP = 1 // the tunnel itself
			}
			if n := tcpDials.Load(); n != wantTCP {
				t.Fatalf("%d TCP dials, want %d", n, wantTCP)
			}
		})
	}
}
