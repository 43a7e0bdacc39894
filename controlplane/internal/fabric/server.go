package fabric

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/quic-go/quic-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"

	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	"github.com/gantry-gpu/gantry/controlplane/internal/loop"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// Deps are what the server runs on.
type Deps struct {
	Pool *pgxpool.Pool
	// SealKey (32 bytes) encrypts the PKI's private keys at rest; app derives it from
	// the master key.
	SealKey   []byte
	NATS      *nats.Conn
	JS        jetstream.JetStream
	Directory fleet.Directory
	Clock     clock.Clock
	IDs       ids.Source
	Log       *slog.Logger

	// OnTaskResult and OnControllerReport, when set, receive what agents report
	// (the allocations feature). They run on the session's receive loop: return fast.
	// OnTaskResult returns nil once the result is recorded (committed, found recorded
	// already, or refused for good): only then does the agent get its TaskResultAck.
	OnTaskResult       func(ctx context.Context, nodeID uuid.UUID, r *fabricv1.TaskResult) error
	OnControllerReport func(ctx context.Context, nodeID uuid.UUID, r *fabricv1.ControllerReport)
	// OnHello, when set, reconciles what a (re)connecting agent holds (Hello's workloads
	// and task ids) against the database. It runs after the Welcome, off the receive
	// loop; its failure is logged (the next Hello reconciles again).
	OnHello func(ctx context.Context, nodeID uuid.UUID, h *fabricv1.Hello) error
}

// Server is one replica's fabric server. It implements fleet.PresenceReader,
// fleet.Disconnector and fleet.FabricInfo.
type Server struct {
	cfg       Config
	deps      Deps
	pki       *PKI
	cert      atomic.Pointer[tls.Certificate] // the server certificate handshakes present
	ln        *fabricnet.Listener
	grpcLn    *fabricnet.StreamListener
	grpc      *grpc.Server
	raw       map[fabricnet.AgentStreamKind]RawStreamHandler // set before Run
	kv        jetstream.KeyValue
	subs      []*nats.Subscription
	startedAt time.Time
	addr      string

	mu       sync.Mutex
	sessions map[uuid.UUID]*session // live sessions on this replica, by node
	ending   sync.WaitGroup
	// bulkStreams counts the raw streams served on bulk side sessions (BulkStreams).
	bulkStreams atomic.Int64

	presence *presenceMirror

	// startupOver is set once the startup window's long TTLs have been shortened.
	startupOver bool
}

var (
	_ fleet.PresenceReader = (*Server)(nil)
	_ fleet.Disconnector   = (*Server)(nil)
	_ fleet.FabricInfo     = (*Server)(nil)
)

// New loads (or creates) the fabric PKI, binds the listener, opens the presence bucket
// and subscribes to the replica subjects. Serving starts with Run.
func New(ctx context.Context, cfg Config, deps Deps) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if deps.Clock == nil {
		deps.Clock = clock.Real{}
	}
	if deps.IDs == nil {
		deps.IDs = ids.V7{}
	}
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	if deps.Directory == nil || deps.NATS == nil || deps.JS == nil || deps.Pool == nil {
		return nil, errors.New("fabric: Pool, NATS, JS and Directory are required")
	}
	s := &Server{cfg: cfg, deps: deps, sessions: map[uuid.UUID]*session{}, startedAt: deps.Clock.Now()}
	s.presence = newPresenceMirror()

	pki, err := LoadPKI(ctx, deps.Pool, deps.SealKey, s.certNames(), deps.Clock, deps.IDs)
	if err != nil {
		return nil, err
	}
	s.pki = pki
	s.cert.Store(&pki.Server)

	s.kv, err = deps.JS.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      cfg.Bucket,
		Description: "gantry fabric presence: node -> replica",
		History:     1,
	})
	if err != nil {
		return nil, fmt.Errorf("fabric: presence bucket: %w", err)
	}

	// Every handshake takes the current certificate: RenewCertificate replaces it
	// while the listener runs.
	tlsConf := &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.cert.Load(), nil }}
	// Session tickets under a key derived from the CA (PKI.TicketKey): a reconnecting
	// agent resumes, even at a replica that was restarted or is not the one it left.
	tlsConf.SetSessionTicketKeys([][32]byte{pki.TicketKey})
	// The reset key comes from the CA, so it survives a crash: the restarted replica
	// resets the tunnels its predecessor held and their agents reconnect at once.
	resetKey := quic.StatelessResetKey(pki.ResetKey)
	s.ln, err = fabricnet.Listen(cfg.Addr, tlsConf, &fabricnet.ListenOptions{DisableUDP: cfg.DisableUDP, StatelessResetKey: &resetKey, MaxConcurrentQUICHandshakes: cfg.MaxConcurrentQUICHandshakes})
	if err != nil {
		return nil, err
	}
	s.addr = cfg.PublicAddr
	if s.addr == "" {
		s.addr = s.ln.Addr().String()
	}

	s.grpcLn = fabricnet.NewStreamListener(s.ln.Addr())
	s.grpc = grpc.NewServer(
		// Small read buffers: one transport per node, thousands of nodes per replica.
		// The write buffer is shared (SharedWriteBuffer: taken from a pool for a
		// flush and given back after it, so an idle transport holds none) and 64 KiB:
		// with 4 KiB every 16 KiB HTTP/2 data frame left as four tunnel writes (four
		// yamux frames and TLS records, or QUIC stream writes), which made a node's
		// StorageFabric.Read cost 4.95 against 2.86 CPU seconds per GiB over TLS+TCP
		// and 8.77 against 6.76 over QUIC (docs/storage.md, attachment benchmark).
		grpc.ReadBufferSize(4<<10), grpc.WriteBufferSize(64<<10), grpc.SharedWriteBuffer(true),
		grpc.MaxRecvMsgSize(4<<20),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
	)
	fabricv1.RegisterFabricServer(s.grpc, &controlService{s: s})

	if err := s.subscribe(); err != nil {
		s.ln.Close()
		return nil, err
	}
	return s, nil
}

func (s *Server) certNames() []string {
	if len(s.cfg.CertNames) > 0 {
		return s.cfg.CertNames
	}
	names := []string{"localhost", "127.0.0.1"}
	for _, a := range []string{s.cfg.PublicAddr, s.cfg.Addr} {
		if h, _, err := net.SplitHostPort(a); err == nil && h != "" && h != "0.0.0.0" && h != "::" {
			names = append(names, h)
		}
	}
	return names
}

// CAPEM is the fabric CA certificate (PEM) agents must trust (fleet.FabricInfo).
func (s *Server) CAPEM() []byte { return s.pki.CAPEM }

// Addr is the address agents dial (fleet.FabricInfo).
func (s *Server) Addr() string { return s.addr }

// ListenAddr is the address actually bound (UDP and TCP share its port number).
func (s *Server) ListenAddr() net.Addr { return s.ln.Addr() }

// QUICRefused is how many QUIC connection attempts the listener refused while its
// bound of handshakes in progress was reached (fabricnet.Listener.QUICRefused).
func (s *Server) QUICRefused() int64 { return s.ln.QUICRefused() }

// PKI is the fabric CA and server certificate.
func (s *Server) PKI() *PKI { return s.pki }

// Certificate is the server certificate handshakes present now.
func (s *Server) Certificate() *x509.Certificate { return s.cert.Load().Leaf }

// RenewCertificate replaces the server certificate once it is within renewBefore of
// expiry (LoadPKI issues the next one, or finds the one another replica issued), so a
// replica that runs for a year does not start refusing agents. Live tunnels keep their
// session; new handshakes get the new certificate. It reports whether it replaced it.
func (s *Server) RenewCertificate(ctx context.Context) (bool, error) {
	if !s.Certificate().NotAfter.Before(s.deps.Clock.Now().Add(renewBefore)) {
		return false, nil
	}
	pki, err := LoadPKI(ctx, s.deps.Pool, s.deps.SealKey, s.certNames(), s.deps.Clock, s.deps.IDs)
	if err != nil {
		return false, err
	}
	s.cert.Store(&pki.Server)
	s.deps.Log.InfoContext(ctx, "fabric server certificate renewed", "serial", pki.Server.Leaf.SerialNumber.String(),
		"not_after", pki.Server.Leaf.NotAfter)
	return true, nil
}

// renewLoop checks the server certificate every certCheckInterval.
func (s *Server) renewLoop(ctx context.Context) {
	loop.Every(ctx, certCheckInterval, s.deps.Log, "fabric server certificate renewal", func(ctx context.Context) error {
		_, err := s.RenewCertificate(ctx)
		return err
	}, "retry_in", certCheckInterval)
}

// ReplicaID names this replica.
func (s *Server) ReplicaID() string { return s.cfg.ReplicaID }

// Run serves tunnels until ctx ends, then closes every tunnel on this replica (agents
// reconnect to another replica, or to this one when it is back) and returns.
func (s *Server) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	run := func(f func(context.Context)) {
		wg.Add(1)
		go func() { defer wg.Done(); f(ctx) }()
	}
	if err := s.startPresence(ctx); err != nil {
		return err
	}
	wg.Add(1)
	go func() { defer wg.Done(); _ = s.grpc.Serve(s.grpcLn) }()
	run(s.watchPresence)
	// Serve only once the mirror holds the bucket: replacement detection and the fleet
	// size behind the TTLs depend on it.
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	_ = s.WaitPresence(wctx)
	wcancel()
	run(s.announceReplica)
	run(s.renewLoop)
	run(s.sweepLoop)
	run(s.acceptLoop)

	<-ctx.Done()
	s.shutdown()
	wg.Wait()
	return nil
}

func (s *Server) shutdown() {
	for _, sub := range s.subs {
		_ = sub.Unsubscribe()
	}
	// Sessions end before the listener closes: closing it ends the QUIC tunnels still
	// open, which their sessions would take for lost tunnels (presence written for each)
	// rather than a shutdown. A tunnel accepted meanwhile fails to authenticate on the
	// ended context and is closed (acceptLoop).
	s.mu.Lock()
	all := make([]*session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		all = append(all, ss)
	}
	s.mu.Unlock()
	// In parallel: closing a TLS+yamux tunnel waits on its writer, and a replica may
	// hold thousands.
	sem := make(chan struct{}, 256)
	for _, ss := range all {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			ss.close(endShutdown, "control plane shutting down")
		}()
	}
	for range cap(sem) {
		sem <- struct{}{} // every close returned
	}
	_ = s.ln.Close()
	s.grpcLn.Close()
	s.grpc.Stop()
	s.ending.Wait()
	// Our announcement goes; our nodes' presence stays, so whichever replica they
	// reconnect to takes them over without an offline blip.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = s.kv.Delete(ctx, replicaKey(s.cfg.ReplicaID))
}

func (s *Server) acceptLoop(ctx context.Context) {
	for {
		// Accepting goes on until shutdown closes the listener: a tunnel that arrives
		// while the replica stops fails to authenticate on the ended context and is
		// closed at once, so its agent tries again (another replica) without waiting.
		fs, err := s.ln.Accept(context.WithoutCancel(ctx))
		if err != nil {
			return
		}
		go s.serveTunnel(ctx, fs)
	}
}

// serveTunnel authenticates a new tunnel and then feeds its agent-opened streams to
// the gRPC server until it ends.
func (s *Server) serveTunnel(ctx context.Context, fs fabricnet.Session) {
	nodeID, authStream, req, err := s.authenticate(ctx, fs)
	if err != nil {
		s.deps.Log.Debug("fabric: tunnel refused", "remote", fs.RemoteAddr().String(), "err", err)
		_ = fs.Close("unauthenticated")
		return
	}
	if fabricnet.IsBulkConn(fs) {
		// A bulk connection is never a tunnel of its own: it serves one raw stream of a
		// live main session (bulk.go), or nothing.
		s.serveBulkConn(ctx, fs, nodeID, authStream, req.GetBulkForSessionId())
		return
	}
	if req.GetBulkForSessionId() != "" {
		s.serveSide(ctx, fs, nodeID, authStream, req.GetBulkForSessionId())
		return
	}
	ss := &session{
		id: s.deps.IDs.New(), nodeID: nodeID, fs: fs, srv: s,
		connectedAt: s.deps.Clock.Now(), done: make(chan struct{}),
		pending: map[string]chan *fabricv1.TaskAck{},
	}
	ss.lastHeartbeat = ss.connectedAt
	ss.hb = s.heartbeatConfig()
	s.register(ss)
	// The session is registered before the agent hears ok, so its Control call finds it.
	werr := fabricnet.WriteFrame(authStream, &fabricv1.AuthResponse{Ok: true, NodeId: nodeID.String(), SessionId: ss.id.String(), BulkSideSessions: true, BulkConnections: true})
	_ = authStream.Close()
	if werr != nil {
		ss.close(endLost, "auth response not delivered")
		return
	}
	go func() {
		select {
		case <-fs.Done():
			ss.close(endLost, "tunnel closed")
		case <-ss.done:
		}
	}()
	for {
		st, err := fs.AcceptStream(ctx)
		if err != nil {
			if ctx.Err() != nil {
				// The server is stopping (Run's context ended before shutdown runs): end
				// as a shutdown, which leaves presence alone. Ending as lost would write
				// presence for every tunnel at once, which stalled a 10,000-tunnel stop
				// for about a minute.
				ss.close(endShutdown, "control plane shutting down")
				return
			}
			ss.close(endLost, "tunnel closed")
			return
		}
		go s.routeStream(ctx, ss, st, false)
	}
}

// routeStream hands an agent-opened stream to the gRPC server or, for a raw stream
// (fabricnet.PeekAgentStream), to the handler of its kind. It runs off the accept loop:
// telling them apart waits for the stream's first byte. On a bulk side session (side)
// only raw streams are served: gRPC there would be a second control path beside the
// session's own.
func (s *Server) routeStream(ctx context.Context, ss *session, st net.Conn, side bool) {
	conn, kind, raw, err := fabricnet.PeekAgentStream(st)
	if err != nil {
		_ = st.Close()
		return
	}
	if !raw {
		if side {
			_ = st.Close()
			return
		}
		s.grpcLn.Push(ctx, &sessionConn{Conn: conn, ss: ss})
		return
	}
	if side {
		s.bulkStreams.Add(1)
	}
	h := s.raw[kind]
	if h == nil {
		_ = fabricnet.WriteReply(st, &fabricv1.StreamReply{Ok: false, ErrorCode: "UNIMPLEMENTED", Message: "unknown raw stream kind"})
		_ = st.Close()
		return
	}
	// The handler's context ends with the tunnel, and carries the session as a gRPC
	// call's does, so NodeID works the same for both.
	hctx, cancel := context.WithCancel(peer.NewContext(ctx, &peer.Peer{Addr: sessionAddr{ss}}))
	defer cancel()
	go func() {
		select {
		case <-ss.done:
			cancel()
		case <-hctx.Done():
		}
	}()
	defer st.Close()
	h(hctx, st)
}

// authenticate reads the auth stream's AuthRequest and checks its node token. On
// success the auth stream is left open for the caller's AuthResponse.
func (s *Server) authenticate(ctx context.Context, fs fabricnet.Session) (uuid.UUID, net.Conn, *fabricv1.AuthRequest, error) {
	actx, cancel := context.WithTimeout(ctx, s.cfg.AuthTimeout)
	defer cancel()
	st, err := fs.AcceptStream(actx)
	if err != nil {
		return uuid.Nil, nil, nil, err
	}
	_ = st.SetDeadline(time.Now().Add(s.cfg.AuthTimeout))
	var req fabricv1.AuthRequest
	if err := fabricnet.ReadFrame(st, &req); err != nil {
		_ = st.Close()
		return uuid.Nil, nil, nil, err
	}
	nodeID, err := s.deps.Directory.AuthenticateNode(actx, req.GetToken())
	if err != nil {
		code := fabricnet.AuthErrUnavailable
		if errors.Is(err, fleet.ErrUnauthenticated) {
			code = fabricnet.AuthErrTokenInvalid
		}
		refuseAuth(st, code)
		return uuid.Nil, nil, nil, err
	}
	return nodeID, st, &req, nil
}

// refuseAuth answers the auth stream st with a refusal and closes it.
func refuseAuth(st net.Conn, code string) {
	_ = fabricnet.WriteFrame(st, &fabricv1.AuthResponse{Ok: false, ErrorCode: code})
	// Let the refusal reach the agent before the tunnel closes: wait for the agent to
	// close its end of the auth stream (bounded by the stream's deadline).
	var b [1]byte
	_, _ = st.Read(b[:])
	_ = st.Close()
}

// register makes ss the node's live session here, replacing an older one.
func (s *Server) register(ss *session) {
	s.mu.Lock()
	old := s.sessions[ss.nodeID]
	s.sessions[ss.nodeID] = ss
	s.ending.Add(1)
	s.mu.Unlock()
	if old != nil {
		old.close(endReplaced, "replaced by a newer tunnel from the same node")
	}
}

func (s *Server) unregister(ss *session) {
	s.mu.Lock()
	if s.sessions[ss.nodeID] == ss {
		delete(s.sessions, ss.nodeID)
	}
	s.mu.Unlock()
}

func (s *Server) local(nodeID uuid.UUID) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[nodeID]
}

// LocalSessions is how many tunnels this replica holds.
func (s *Server) LocalSessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

// heartbeatConfig chooses the heartbeat interval and TTL for a node now: scaled to the
// fleet size so the fleet-wide rate stays under MaxHeartbeatsPerSecond, never under
// MinHeartbeatInterval, with up to 25% jitter so nodes that connected together do not
// heartbeat together; TTL is two intervals plus the grace. Inside the startup window
// everyone gets StartupTTL.
func (s *Server) heartbeatConfig() heartbeat {
	fleetSize := s.presence.onlineCount()
	interval := time.Duration(float64(fleetSize) / s.cfg.MaxHeartbeatsPerSecond * float64(time.Second))
	interval = max(interval, s.cfg.MinHeartbeatInterval)
	interval += time.Duration(rand.Int64N(int64(interval)/4 + 1))
	ttl := 2*interval + s.cfg.HeartbeatGrace
	if s.inStartup() {
		ttl = max(ttl, s.cfg.StartupTTL)
	}
	return heartbeat{interval: interval, ttl: ttl, telemetry: s.cfg.TelemetryInterval}
}

func (s *Server) inStartup() bool {
	return s.deps.Clock.Now().Before(s.startedAt.Add(s.cfg.StartupTTL))
}

type heartbeat struct {
	interval, ttl, telemetry time.Duration
}

// sessionConn is an agent-opened stream; its RemoteAddr carries the session so the
// gRPC handler knows which node it serves.
type sessionConn struct {
	net.Conn
	ss *session
}

func (c *sessionConn) RemoteAddr() net.Addr { return sessionAddr{c.ss} }

type sessionAddr struct{ ss *session }

func (a sessionAddr) Network() string { return "gantry-fabric" }
func (a sessionAddr) String() string  { return "node/" + a.ss.nodeID.String() }

// Close releases the listener of a server that is not running (Run does it itself).
func (s *Server) Close() {
	_ = s.ln.Close()
	for _, sub := range s.subs {
		_ = sub.Unsubscribe()
	}
}

// DefaultReplicaID is the host name reduced to the replica id alphabet.
func DefaultReplicaID() string {
	h, _ := os.Hostname()
	var b strings.Builder
	for _, r := range h {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		default:
			b.WriteRune('-')
		}
		if b.Len() == 64 {
			break
		}
	}
	if b.Len() == 0 {
		return "replica"
	}
	return b.String()
}
