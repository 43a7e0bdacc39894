package agent_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"sync"
	"testing"
	"time"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// peer is the far end of the tunnel for the agent's unit tests: the real transport
// (fabricnet) and the real generated gRPC service, with just enough server behaviour to
// observe what the agent says. The real fabric server is exercised end to end in
// controlplane/e2e.
type peer struct {
	t      *testing.T
	ln     *fabricnet.Listener
	caPool *x509.CertPool
	caPEM  []byte
	token  string
	hb     *fabricv1.HeartbeatConfig

	grpcSrv *grpc.Server
	streams *fabricnet.StreamListener

	mu       sync.Mutex
	sessions []fabricnet.Session
	hellos   []*fabricv1.Hello
	msgs     []*fabricv1.AgentMessage
	authFail int
	ctl      fabricv1.Fabric_ControlServer
	ctlDone  chan struct{}
	ctls     int // control streams welcomed so far
	changed  chan struct{}
	storage  peerStorage // StorageFabric, served on the same agent-opened streams
	fabricv1.UnimplementedFabricServer
}

func newPeer(t *testing.T, opts *fabricnet.ListenOptions) *peer {
	t.Helper()
	cert, pool, caPEM := testCert(t)
	p := &peer{t: t, caPool: pool, caPEM: caPEM, token: "gnt_test-token", changed: make(chan struct{}, 1),
		hb: &fabricv1.HeartbeatConfig{Interval: durationpb.New(100 * time.Millisecond), Ttl: durationpb.New(time.Second), TelemetryInterval: durationpb.New(150 * time.Millisecond)}}
	ln, err := fabricnet.Listen("127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}}, opts)
	if err != nil {
		t.Fatal(err)
	}
	p.ln = ln
	p.streams = fabricnet.NewStreamListener(ln.Addr())
	p.grpcSrv = grpc.NewServer()
	fabricv1.RegisterFabricServer(p.grpcSrv, p)
	fabricv1.RegisterStorageFabricServer(p.grpcSrv, &p.storage)
	go func() { _ = p.grpcSrv.Serve(p.streams) }()
	ctx, cancel := context.WithCancel(context.Background())
	go p.accept(ctx)
	t.Cleanup(func() {
		cancel()
		_ = ln.Close()
		p.mu.Lock()
		for _, s := range p.sessions {
			_ = s.Close("test over")
		}
		p.mu.Unlock()
		p.grpcSrv.Stop()
	})
	return p
}

func (p *peer) clientTLS() *tls.Config {
	return &tls.Config{RootCAs: p.caPool, ServerName: "localhost"}
}

func (p *peer) addr() string { return p.ln.Addr().String() }

func (p *peer) accept(ctx context.Context) {
	for {
		s, err := p.ln.Accept(ctx)
		if err != nil {
			return
		}
		go p.serveSession(ctx, s)
	}
}

func (p *peer) serveSession(ctx context.Context, s fabricnet.Session) {
	st, err := s.AcceptStream(ctx)
	if err != nil {
		_ = s.Close("no auth")
		return
	}
	var req fabricv1.AuthRequest
	if err := fabricnet.ReadFrame(st, &req); err != nil {
		_ = s.Close("bad auth")
		return
	}
	if req.GetToken() != p.token {
		_ = fabricnet.WriteFrame(st, &fabricv1.AuthResponse{Ok: false, ErrorCode: fabricnet.AuthErrTokenInvalid})
		p.mu.Lock()
		p.authFail++
		p.mu.Unlock()
		p.poke()
		time.Sleep(50 * time.Millisecond)
		_ = s.Close("token refused")
		return
	}
	_ = fabricnet.WriteFrame(st, &fabricv1.AuthResponse{Ok: true, NodeId: "node-1", SessionId: "s"})
	_ = st.Close()
	p.mu.Lock()
	p.sessions = append(p.sessions, s)
	p.mu.Unlock()
	for {
		c, err := s.AcceptStream(ctx)
		if err != nil {
			return
		}
		if !p.streams.Push(ctx, c) {
			return
		}
	}
}

func (p *peer) poke() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// Control implements fabricv1.FabricServer.
func (p *peer) Control(stream fabricv1.Fabric_ControlServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.hellos = append(p.hellos, first.GetHello())
	n := len(p.hellos)
	p.mu.Unlock()
	if err := stream.Send(&fabricv1.ControlMessage{Msg: &fabricv1.ControlMessage_Welcome{Welcome: &fabricv1.Welcome{
		NodeId: "node-1", SessionId: "session-" + string(rune('0'+n)), ReplicaId: "r1", Heartbeat: p.hb, ServerTime: timestamppb.Now(),
	}}}); err != nil {
		return err
	}
	// Tests may send on the stream only after the Welcome has gone out.
	done := make(chan struct{})
	p.mu.Lock()
	p.ctl = stream
	p.ctls++
	p.ctlDone = done
	p.mu.Unlock()
	defer close(done)
	p.poke()
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		p.mu.Lock()
		p.msgs = append(p.msgs, m)
		p.mu.Unlock()
		p.poke()
	}
}

// send pushes a control message down the current Control stream.
func (p *peer) send(m *fabricv1.ControlMessage) {
	p.t.Helper()
	p.mu.Lock()
	ctl := p.ctl
	p.mu.Unlock()
	if ctl == nil {
		p.t.Fatal("no control stream")
	}
	if err := ctl.Send(m); err != nil {
		p.t.Fatal(err)
	}
}

// cut closes every tunnel from the server side (the connection being cut).
func (p *peer) cut() {
	p.mu.Lock()
	ss := p.sessions
	p.sessions = nil
	p.mu.Unlock()
	for _, s := range ss {
		_ = s.Close("cut by test")
	}
}

// waitFor polls cond (under the peer's lock) until it holds or 20 s pass.
func (p *peer) waitFor(what string, cond func() bool) {
	p.t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		p.mu.Lock()
		ok := cond()
		p.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-p.changed:
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			p.t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// count returns how many received messages match f (call inside waitFor or after).
func (p *peer) countLocked(f func(*fabricv1.AgentMessage) bool) int {
	n := 0
	for _, m := range p.msgs {
		if f(m) {
			n++
		}
	}
	return n
}

func testCert(t *testing.T) (tls.Certificate, *x509.CertPool, []byte) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test fabric CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTpl, caTpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
}
