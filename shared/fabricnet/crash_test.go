package fabricnet_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// A crash is a listener whose process dies without a word to its peers. The tests run
// the listener in a child process (this test binary again, see crashChild) and kill it
// with SIGKILL: nothing in-process closes a quic-go transport without telling its peers
// (Listener.Close sends CONNECTION_CLOSE), and only the kernel ends a killed process's
// TCP connections the way it does in production.

const (
	envCrashChild = "FABRICNET_CRASH_CHILD"
	envCrashAddr  = "FABRICNET_CRASH_ADDR"
	envCrashKey   = "FABRICNET_CRASH_RESET_KEY"
	envCrashCert  = "FABRICNET_CRASH_CERT"
	envCrashPKey  = "FABRICNET_CRASH_KEY"
	envCrashGRPC  = "FABRICNET_CRASH_GRPC"
)

// peerIdle is the agents' idle timeout in these tests: far past their deadlines, so only
// a reset or a closed connection can end a tunnel in time.
const peerIdle = 10 * time.Minute

// crashChild serves the fabric on $FABRICNET_CRASH_ADDR until it is killed, echoing
// every stream or, with $FABRICNET_CRASH_GRPC, serving gRPC's health service on them
// like the fabric server does its own; it prints "ready <addr>" once listening.
func crashChild() {
	fail := func(err error) { fmt.Fprintln(os.Stderr, "crash child:", err); os.Exit(1) }
	cert, err := tls.X509KeyPair([]byte(os.Getenv(envCrashCert)), []byte(os.Getenv(envCrashPKey)))
	if err != nil {
		fail(err)
	}
	opts := &fabricnet.ListenOptions{QUIC: &quic.Config{MaxIdleTimeout: peerIdle}}
	if k := os.Getenv(envCrashKey); k != "" {
		b, err := hex.DecodeString(k)
		if err != nil || len(b) != 32 {
			fail(fmt.Errorf("reset key %q", k))
		}
		opts.StatelessResetKey = (*quic.StatelessResetKey)(b)
	}
	ln, err := fabricnet.Listen(os.Getenv(envCrashAddr), &tls.Config{Certificates: []tls.Certificate{cert}}, opts)
	if err != nil {
		fail(err)
	}
	serve := func(st net.Conn) { _, _ = io.Copy(st, st) }
	if os.Getenv(envCrashGRPC) != "" {
		gl := fabricnet.NewStreamListener(ln.Addr())
		gs := grpc.NewServer(grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}))
		healthpb.RegisterHealthServer(gs, health.NewServer())
		go func() { _ = gs.Serve(gl) }()
		serve = func(st net.Conn) { gl.Push(context.Background(), st) }
	}
	fmt.Printf("ready %s\n", ln.Addr())
	for {
		s, err := ln.Accept(context.Background())
		if err != nil {
			fail(err)
		}
		go func() {
			for {
				st, err := s.AcceptStream(context.Background())
				if err != nil {
					return
				}
				go serve(st)
			}
		}()
	}
}

// crashable is a listener in a child process.
type crashable struct {
	cmd  *exec.Cmd
	addr string
}

// startCrashable starts a child listener on addr with the server certificate of srvTLS
// and the reset key (nil: none), serving gRPC or echoing; it is killed when the test
// ends.
func startCrashable(t *testing.T, addr string, srvTLS *tls.Config, key *quic.StatelessResetKey, withGRPC bool) *crashable {
	t.Helper()
	c := srvTLS.Certificates[0]
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]})
	der, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envCrashChild+"=1", envCrashAddr+"="+addr,
		envCrashCert+"="+string(certPEM), envCrashPKey+"="+string(keyPEM))
	if key != nil {
		cmd.Env = append(cmd.Env, envCrashKey+"="+hex.EncodeToString(key[:]))
	}
	if withGRPC {
		cmd.Env = append(cmd.Env, envCrashGRPC+"=1")
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cr := &crashable{cmd: cmd}
	t.Cleanup(cr.kill)
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		ready <- strings.TrimSpace(line)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case line := <-ready:
		a, ok := strings.CutPrefix(line, "ready ")
		if !ok {
			t.Fatalf("child listener: %q", line)
		}
		cr.addr = a
	case <-time.After(30 * time.Second):
		t.Fatal("child listener did not start")
	}
	return cr
}

// kill ends the child with SIGKILL and waits for it to be gone (its sockets closed).
func (c *crashable) kill() {
	if c.cmd.ProcessState != nil {
		return
	}
	_ = c.cmd.Process.Kill()
	_ = c.cmd.Wait()
}

// echoOnce opens a stream, writes msg and reads it back.
func echoOnce(ctx context.Context, s fabricnet.Session, msg string) error {
	st, err := s.OpenStream(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = st.SetDeadline(dl)
	}
	if _, err := st.Write([]byte(msg)); err != nil {
		return err
	}
	b := make([]byte, len(msg))
	if _, err := io.ReadFull(st, b); err != nil {
		return err
	}
	if string(b) != msg {
		return fmt.Errorf("echo %q, want %q", b, msg)
	}
	return nil
}

func resetKey(t *testing.T) *quic.StatelessResetKey {
	var k quic.StatelessResetKey
	if _, err := rand.Read(k[:]); err != nil {
		t.Fatal(err)
	}
	return &k
}

// TestRestartAfterCrashResetsQUICTunnels: a control plane killed with SIGKILL tells its
// QUIC peers nothing. Restarted on the same port with the same stateless reset key, it
// answers the first packet an agent sends on its old tunnel with a stateless reset, and
// the tunnel ends at once instead of at the agent's idle timeout (here ten minutes).
// Without a key (or with another one) the restarted listener drops those packets.
func TestRestartAfterCrashResetsQUICTunnels(t *testing.T) {
	t.Parallel()
	srvTLS, cliTLS := certs(t)
	key := resetKey(t)
	first := startCrashable(t, "127.0.0.1:0", srvTLS, key, false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := fabricnet.Dial(ctx, first.addr, fabricnet.ModeQUIC, cliTLS,
		&fabricnet.DialOptions{QUIC: &quic.Config{MaxIdleTimeout: peerIdle, KeepAlivePeriod: peerIdle / 2}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close("done")
	if err := echoOnce(ctx, s, "before the crash"); err != nil {
		t.Fatal(err)
	}

	first.kill()
	startCrashable(t, first.addr, srvTLS, key, false)
	// The agent's next packet on the old tunnel (a heartbeat's worth of bytes) reaches
	// the new process, which knows no such connection.
	go func() {
		st, err := s.OpenStream(ctx)
		if err == nil {
			_, _ = st.Write([]byte(strings.Repeat("heartbeat ", 8)))
		}
	}()
	select {
	case <-s.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the tunnel to the crashed listener is still open 20 s after its restart: no stateless reset")
	}
	var reset *quic.StatelessResetError
	if !errors.As(s.Err(), &reset) {
		t.Fatalf("the tunnel ended by %v, want a stateless reset", s.Err())
	}
	// Each agent hears of a crash at its own next packet: no spread needed on top.
	if fabricnet.FleetWideEnd(s.Err()) {
		t.Fatal("a stateless reset counts as a fleet-wide end")
	}
	// And the agent connects to the restarted listener as usual.
	s2, err := fabricnet.Dial(ctx, first.addr, fabricnet.ModeQUIC, cliTLS, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close("done")
	if err := echoOnce(ctx, s2, "after the restart"); err != nil {
		t.Fatal(err)
	}
}

// TestRestartAfterCrashResetsIdleQUICTunnels: an agent that sends nothing but keeps its
// tunnel alive still hears the reset, within GRPCClient's ping interval (15 s) of the
// restart. QUIC's keep-alive alone (a PING packet, here every 2 s) is too short for
// quic-go to answer with a reset, and the agent's heartbeats may be minutes apart.
// Path MTU probes, which are long, are switched off: they would end the tunnel for the
// wrong reason right after the handshake.
func TestRestartAfterCrashResetsIdleQUICTunnels(t *testing.T) {
	t.Parallel()
	srvTLS, cliTLS := certs(t)
	key := resetKey(t)
	first := startCrashable(t, "127.0.0.1:0", srvTLS, key, true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := fabricnet.Dial(ctx, first.addr, fabricnet.ModeQUIC, cliTLS, &fabricnet.DialOptions{QUIC: &quic.Config{
		MaxIdleTimeout: peerIdle, KeepAlivePeriod: 2 * time.Second, DisablePathMTUDiscovery: true,
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close("done")
	cc, err := fabricnet.GRPCClient(s)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if r, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v", r, err)
	}
	// Idle: what is in flight now (acknowledgements, window updates) would be resent
	// after the crash, in packets long enough to be reset, and end the tunnel whatever
	// the ping does. Not a timing assertion: a slow machine only makes the wait shorter
	// than meant, never the test fail.
	time.Sleep(3 * time.Second)
	first.kill()
	startCrashable(t, first.addr, srvTLS, key, true)
	select {
	case <-s.Done():
	case <-time.After(45 * time.Second):
		t.Fatal("the idle tunnel to the crashed listener is still open 45 s after its restart: no stateless reset")
	}
}

// TestCrashedQUICPeerEndsAtIdleTimeout: an agent whose stateless reset never comes
// still leaves a dead control plane behind within the tunnel's idle timeout (15 s).
// quic-go sends at most four resets at a time and drops the rest, so during a
// reconnect storm most agents' first reset is lost (1,400 dropped for 2,000 agents in
// the bench) and their next chance is their next packet, at a probe timeout that doubles
// each time; here nobody restarts at all. The agent's keep-alive (every 5 s) goes
// unanswered and the tunnel ends with an idle timeout. The deadline only keeps the test
// from hanging; with the former 45 s timeout it fails.
func TestCrashedQUICPeerEndsAtIdleTimeout(t *testing.T) {
	t.Parallel()
	srvTLS, cliTLS := certs(t)
	c := startCrashable(t, "127.0.0.1:0", srvTLS, nil, false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := fabricnet.Dial(ctx, c.addr, fabricnet.ModeQUIC, cliTLS, nil) // the agent's defaults
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close("done")
	if err := echoOnce(ctx, s, "before the crash"); err != nil {
		t.Fatal(err)
	}
	c.kill()
	select {
	case <-s.Done():
	case <-time.After(40 * time.Second):
		t.Fatal("the tunnel to the killed listener is still open 40 s after the kill")
	}
	var idle *quic.IdleTimeoutError
	if !errors.As(s.Err(), &idle) {
		t.Fatalf("the tunnel ended by %v, want an idle timeout", s.Err())
	}
	if fabricnet.FleetWideEnd(s.Err()) {
		t.Fatal("an idle timeout counts as a fleet-wide end")
	}
}

// TestRestartAfterCrashEndsEveryQUICTunnel: a fleet's stale tunnels all end when the
// crashed listener is back, every one by its stateless reset or, where quic-go dropped
// the reset, by its idle timeout, and every agent connects to the restarted listener.
// The agents send their next packets together, as a fleet does after a restart: more
// resets than quic-go's queue of four holds.
func TestRestartAfterCrashEndsEveryQUICTunnel(t *testing.T) {
	t.Parallel()
	const agents = 100
	srvTLS, cliTLS := certs(t)
	key := resetKey(t)
	first := startCrashable(t, "127.0.0.1:0", srvTLS, key, false)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sessions := make([]fabricnet.Session, agents)
	for i := range sessions {
		s, err := fabricnet.Dial(ctx, first.addr, fabricnet.ModeQUIC, cliTLS, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close("done")
		if err := echoOnce(ctx, s, "before the crash"); err != nil {
			t.Fatal(err)
		}
		sessions[i] = s
	}
	first.kill()
	startCrashable(t, first.addr, srvTLS, key, false)
	for _, s := range sessions {
		go func() {
			if st, err := s.OpenStream(ctx); err == nil {
				_, _ = st.Write([]byte(strings.Repeat("heartbeat ", 8)))
			}
		}()
	}
	var resets, idles int
	for i, s := range sessions {
		select {
		case <-s.Done():
		case <-ctx.Done():
			t.Fatalf("tunnel %d of %d still open after the restart (%d reset, %d idle timeouts so far)", i, agents, resets, idles)
		}
		var reset *quic.StatelessResetError
		var idle *quic.IdleTimeoutError
		switch err := s.Err(); {
		case errors.As(err, &reset):
			resets++
		case errors.As(err, &idle):
			idles++
		default:
			t.Fatalf("tunnel %d ended by %v, want a stateless reset or an idle timeout", i, err)
		}
	}
	t.Logf("%d tunnels ended by a stateless reset, %d by their idle timeout", resets, idles)
	for range agents {
		s, err := fabricnet.Dial(ctx, first.addr, fabricnet.ModeQUIC, cliTLS, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = echoOnce(ctx, s, "after the restart")
		_ = s.Close("done")
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestCrashEndsTCPTunnels: on the TLS+yamux fallback the kernel closes a killed
// process's connections, so the agent learns of the crash at once, restart or not
// (yamux's keepalive, 15 s, is not what ends it).
func TestCrashEndsTCPTunnels(t *testing.T) {
	t.Parallel()
	srvTLS, cliTLS := certs(t)
	c := startCrashable(t, "127.0.0.1:0", srvTLS, nil, false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := fabricnet.Dial(ctx, c.addr, fabricnet.ModeTCP, cliTLS, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close("done")
	if err := echoOnce(ctx, s, "before the crash"); err != nil {
		t.Fatal(err)
	}
	c.kill()
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the TCP tunnel to the killed listener is still open 10 s after the kill")
	}
	if _, err := net.Dial("tcp", c.addr); err == nil {
		t.Fatal("the killed listener's port still accepts")
	}
}
