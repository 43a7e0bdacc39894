package fabricnet_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// certs returns a server config with a self-signed certificate for 127.0.0.1 and a
// client config trusting it.
func certs(t testing.TB) (*tls.Config, *tls.Config) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}},
		&tls.Config{RootCAs: pool}
}

func TestBothTransportsOnOnePort(t *testing.T) {
	srvTLS, cliTLS := certs(t)
	cases := []struct {
		name string
		opts *fabricnet.ListenOptions
		mode fabricnet.Mode
		want fabricnet.Transport
	}{
		{"quic", nil, fabricnet.ModeQUIC, fabricnet.TransportQUIC},
		{"tcp", nil, fabricnet.ModeTCP, fabricnet.TransportTCP},
		{"auto", nil, fabricnet.ModeAuto, fabricnet.TransportQUIC},
		{"auto, UDP silent", &fabricnet.ListenOptions{DisableUDP: true}, fabricnet.ModeAuto, fabricnet.TransportTCP},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := fabricnet.Listen("127.0.0.1:0", srvTLS, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			go func() {
				s, err := ln.Accept(ctx)
				if err != nil {
					return
				}
				// Server opens a raw stream with a preamble; the client echoes.
				c, err := fabricnet.OpenRaw(ctx, s, &fabricv1.StreamPreamble{Kind: fabricv1.StreamKind_STREAM_KIND_APP_PROXY, TargetPort: 8888})
				if err != nil {
					return
				}
				_, _ = c.Write([]byte("ping"))
			}()
			s, err := fabricnet.Dial(ctx, ln.Addr().String(), tc.mode, cliTLS, &fabricnet.DialOptions{QUICFallbackAfter: 300 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close("done")
			if s.Transport() != tc.want || s.TLS().NegotiatedProtocol != fabricnet.ALPN {
				t.Fatalf("transport %s alpn %q", s.Transport(), s.TLS().NegotiatedProtocol)
			}
			st, err := s.AcceptStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			pre, err := fabricnet.ReadPreamble(st)
			if err != nil || pre.GetTargetPort() != 8888 {
				t.Fatalf("preamble %v, %v", pre, err)
			}
			if err := fabricnet.WriteReply(st, &fabricv1.StreamReply{Ok: true}); err != nil {
				t.Fatal(err)
			}
			// ReadFrame left the payload unread.
			b := make([]byte, 4)
			if _, err := io.ReadFull(st, b); err != nil || string(b) != "ping" {
				t.Fatalf("payload %q, %v", b, err)
			}
		})
	}
}

func TestListenPortZeroBindsBothProtocols(t *testing.T) {
	srvTLS, _ := certs(t)
	ln, err := fabricnet.Listen("127.0.0.1:0", srvTLS, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	// Both are taken: a second listener on the same port fails.
	if _, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}); err == nil {
		t.Fatal("UDP port not bound")
	}
	if _, err := fabricnet.Listen(ln.Addr().String(), srvTLS, nil); err == nil {
		t.Fatal("second Listen on the same port succeeded")
	}
}

func TestFrameLimit(t *testing.T) {
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	go func() { _, _ = c1.Write([]byte{0xff, 0xff, 0x7f}) }() // ~2 MiB length prefix
	if err := fabricnet.ReadFrame(c2, &fabricv1.StreamPreamble{}); err != fabricnet.ErrFrameTooLarge {
		t.Fatalf("err = %v", err)
	}
}

// Many streams at once, in both directions, with writes of every size from one byte to
// past the stream window: every byte arrives, in order, on its own stream.
// listenFor starts a fabric listener on loopback and a context of at most a minute, both
// ended with the test.
func listenFor(t *testing.T, srvTLS *tls.Config) (*fabricnet.Listener, context.Context) {
	ln, err := fabricnet.Listen("127.0.0.1:0", srvTLS, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ln, ctx
}

func TestConcurrentStreamsCarryEveryByte(t *testing.T) {
	srvTLS, cliTLS := certs(t)
	for _, mode := range []fabricnet.Mode{fabricnet.ModeTCP, fabricnet.ModeQUIC} {
		t.Run(string(mode), func(t *testing.T) {
			ln, ctx := listenFor(t, srvTLS)
			go func() { // echo every stream back
				s, err := ln.Accept(ctx)
				if err != nil {
					return
				}
				for {
					st, err := s.AcceptStream(ctx)
					if err != nil {
						return
					}
					go func() { _, _ = io.Copy(st, st); _ = st.Close() }()
				}
			}()
			s, err := fabricnet.Dial(ctx, ln.Addr().String(), mode, cliTLS, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close("done")
			sizes := []int{1, 11, 12, 13, 4096, 16 << 10, 64<<10 + 7, 300 << 10, 1<<20 + 3, 3 << 20}
			errs := make(chan error, len(sizes))
			for i, size := range sizes {
				go func() {
					errs <- func() error {
						st, err := s.OpenStream(ctx)
						if err != nil {
							return err
						}
						defer st.Close()
						want := make([]byte, size)
						for j := range want {
							want[j] = byte(i*31 + j*7)
						}
						go func() {
							for off := 0; off < len(want); off += 777 * (i + 1) {
								end := min(off+777*(i+1), len(want))
								if _, err := st.Write(want[off:end]); err != nil {
									return
								}
							}
						}()
						got := make([]byte, size)
						if _, err := io.ReadFull(st, got); err != nil {
							return err
						}
						if !bytes.Equal(got, want) {
							return fmt.Errorf("stream %d: %d bytes differ", i, size)
						}
						return nil
					}()
				}()
			}
			for range sizes {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestCloseUnblocksABlockedWrite: a stream's Close returns a Write that waits for a peer
// that stopped reading, on both transports, as net.Conn promises. quic-go's own Close
// concurrent with such a Write left it blocked for good (a terminal session's output
// pump hung on a browser that had gone away).
func TestCloseUnblocksABlockedWrite(t *testing.T) {
	srvTLS, cliTLS := certs(t)
	for _, mode := range []fabricnet.Mode{fabricnet.ModeTCP, fabricnet.ModeQUIC} {
		t.Run(string(mode), func(t *testing.T) {
			ln, ctx := listenFor(t, srvTLS)
			accepted := make(chan net.Conn, 1)
			go func() { // accept the stream and never read it
				s, err := ln.Accept(ctx)
				if err != nil {
					return
				}
				st, err := s.AcceptStream(ctx)
				if err != nil {
					return
				}
				accepted <- st
			}()
			s, err := fabricnet.Dial(ctx, ln.Addr().String(), mode, cliTLS, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close("done")
			st, err := s.OpenStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var written atomic.Int64
			done := make(chan error, 1)
			go func() {
				chunk := make([]byte, 64<<10)
				for {
					n, err := st.Write(chunk)
					written.Add(int64(n))
					if err != nil {
						done <- err
						return
					}
				}
			}()
			select {
			case peer := <-accepted:
				defer peer.Close()
			case <-ctx.Done():
				t.Fatal("the stream never reached the peer")
			}
			// Wait until the windows are full: the writer makes no progress.
			for last := int64(-1); ; {
				time.Sleep(100 * time.Millisecond)
				if n := written.Load(); n == last {
					break
				} else {
					last = n
				}
			}
			select {
			case err := <-done:
				t.Fatalf("the Write returned before Close: %v", err)
			default:
			}
			_ = st.Close()
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("the blocked Write returned no error")
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("the Write is still blocked 10 s after Close (%d bytes written)", written.Load())
			}
		})
	}
}

// Closing the listener ends the QUIC tunnels it accepted with a CONNECTION_CLOSE, so
// their peers learn at once instead of at their idle timeout (here ten minutes, past
// the test's wait). quic-go's transport close alone drops them silently; the control
// plane's shutdown raced its tunnels' own closes against it, and an agent that lost
// the race came back 45 s later (a flaky restart test in CI).
func TestListenerCloseTellsQUICPeers(t *testing.T) {
	srvTLS, cliTLS := certs(t)
	ln, ctx := listenFor(t, srvTLS)
	accepted := make(chan fabricnet.Session, 1)
	go func() {
		if s, err := ln.Accept(ctx); err == nil {
			accepted <- s
		}
	}()
	s, err := fabricnet.Dial(ctx, ln.Addr().String(), fabricnet.ModeQUIC, cliTLS,
		&fabricnet.DialOptions{QUIC: &quic.Config{MaxIdleTimeout: 10 * time.Minute, KeepAlivePeriod: 5 * time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close("done")
	select {
	case <-accepted:
	case <-ctx.Done():
		t.Fatal("the listener did not accept the tunnel")
	}
	_ = ln.Close()
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the peer was not told the listener closed")
	}
	// Every agent of a stopping control plane is told at once: their reconnects are
	// spread (agent.Backoff.Spread).
	if !fabricnet.FleetWideEnd(s.Err()) {
		t.Fatalf("the listener's close (%v) is not a fleet-wide end", s.Err())
	}
}

// A tunnel the agent closed itself ended for that agent alone.
func TestOwnCloseIsNotAFleetWideEnd(t *testing.T) {
	srvTLS, cliTLS := certs(t)
	for _, mode := range []fabricnet.Mode{fabricnet.ModeTCP, fabricnet.ModeQUIC} {
		t.Run(string(mode), func(t *testing.T) {
			ln, ctx := listenFor(t, srvTLS)
			s, err := fabricnet.Dial(ctx, ln.Addr().String(), mode, cliTLS, nil)
			if err != nil {
				t.Fatal(err)
			}
			if s.Err() != nil {
				t.Fatalf("Err of a live tunnel = %v", s.Err())
			}
			_ = s.Close("agent reconnecting")
			<-s.Done()
			if s.Err() == nil {
				t.Fatal("Err of a closed tunnel is nil")
			}
			if mode == fabricnet.ModeQUIC && fabricnet.FleetWideEnd(s.Err()) {
				t.Fatalf("the agent's own close (%v) counts as a fleet-wide end", s.Err())
			}
		})
	}
}

// A tunnel whose handshake completed but that nobody accepted before the listener
// closed is closed with it, on both transports: its peer learns at once instead of
// waiting out its own authentication timeout.
func TestListenerCloseEndsUnacceptedTunnels(t *testing.T) {
	srvTLS, cliTLS := certs(t)
	for _, mode := range []fabricnet.Mode{fabricnet.ModeTCP, fabricnet.ModeQUIC} {
		t.Run(string(mode), func(t *testing.T) {
			ln, ctx := listenFor(t, srvTLS)
			s, err := fabricnet.Dial(ctx, ln.Addr().String(), mode, cliTLS, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close("done")
			time.Sleep(100 * time.Millisecond) // the server side completes its handshake
			_ = ln.Close()
			select {
			case <-s.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the peer of an unaccepted tunnel was not told the listener closed")
			}
			if !fabricnet.FleetWideEnd(s.Err()) {
				t.Fatalf("the listener's close (%v) is not a fleet-wide end", s.Err())
			}
		})
	}
}

// TestTCPTunnelsAfterClosedOnesStayIntact: TLS+yamux tunnels are closed while frames
// are still queued for their writer, and new tunnels keep carrying bulk writes. The
// write buffers are shared between tunnels: one handed back with a closing tunnel's
// queued plaintext in it once put that plaintext on the next tunnel's wire ahead of its
// TLS records, and the peer ended that tunnel ("record with version 100").
func TestTCPTunnelsAfterClosedOnesStayIntact(t *testing.T) {
	srvTLS, cliTLS := certs(t)
	ln, err := fabricnet.Listen("127.0.0.1:0", srvTLS, &fabricnet.ListenOptions{DisableUDP: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			s, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			go func() {
				defer s.Close("test done")
				for {
					st, err := s.AcceptStream(context.Background())
					if err != nil {
						return
					}
					go func() { _, _ = io.Copy(io.Discard, st); _ = st.Close() }()
				}
			}()
		}
	}()
	cli := cliTLS.Clone()
	cli.ServerName = "127.0.0.1"
	buf := make([]byte, 64<<10)
	for round := range 12 {
		s, err := fabricnet.Dial(context.Background(), ln.Addr().String(), fabricnet.ModeTCP, cli, nil)
		if err != nil {
			t.Fatal(err)
		}
		st, err := s.OpenStream(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for i := range 64 {
			if _, err := st.Write(buf); err != nil {
				t.Fatalf("tunnel %d, write %d: %v (tunnel ended: %v)", round, i, err, s.Err())
			}
		}
		// Closed right after the last write, frames possibly still queued.
		_ = st.Close()
		_ = s.Close("round done")
	}
}
