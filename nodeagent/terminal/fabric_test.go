package terminal

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"github.com/gantry-gpu/gantry/shared/termproto"
	"github.com/google/uuid"
)

// tunnel is a real fabric session between a control-plane end (cp) and an agent end
// whose accepted raw streams srv serves, as nodeagent/agent does.
func tunnel(t testing.TB, srv *Server, mode fabricnet.Mode) fabricnet.Session {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fabric-test"},
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
	ln, err := fabricnet.Listen("127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	agentSess, err := fabricnet.Dial(ctx, ln.Addr().String(), mode, &tls.Config{RootCAs: pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = agentSess.Close("test over") })
	cp, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Close("test over") })
	go func() {
		for {
			st, err := agentSess.AcceptStream(ctx)
			if err != nil {
				return
			}
			go func() {
				pre, err := fabricnet.ReadPreamble(st)
				if err != nil {
					_ = st.Close()
					return
				}
				srv.ServeStream(ctx, pre, st)
			}()
		}
	}()
	return cp
}

// The whole agent side over both real transports: accept, echo, keystroke round trips
// through FrameConn, exit; and a refusal as the control plane sees it.
func TestOverTheFabric(t *testing.T) {
	for _, mode := range []fabricnet.Mode{fabricnet.ModeQUIC, fabricnet.ModeTCP} {
		t.Run(string(mode), func(t *testing.T) {
			srv, _, alloc := newServer(t, Options{})
			cp := tunnel(t, srv, mode)
			ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
			defer cancel()

			_, err := fabricnet.OpenRaw(ctx, cp, preamble(uuid.NewString(), uuid.NewString()))
			var refused *fabricnet.StreamRefusedError
			if !errors.As(err, &refused) || refused.Code != CodeAllocationNotActive {
				t.Fatalf("unknown allocation: %v, want refusal %s", err, CodeAllocationNotActive)
			}

			st, err := fabricnet.OpenRaw(ctx, cp, preamble(uuid.NewString(), alloc, EchoCommand...))
			if err != nil {
				t.Fatal(err)
			}
			_ = st.SetDeadline(time.Now().Add(waitLimit))
			fc := NewFrameConn(st)
			rtts, err := EchoRoundTrip(fc, 50)
			if err != nil || len(rtts) != 50 {
				t.Fatalf("echo round trips: %d, %v", len(rtts), err)
			}
			if err := fc.Control(termproto.Control{Type: termproto.TypeClose}); err != nil {
				t.Fatal(err)
			}
			rest, err := io.ReadAll(fc)
			if err != nil {
				t.Fatalf("after close: %v (output %q)", err, rest)
			}
			if fc.Exit == nil || *fc.Exit.Code != -1 || fc.Exit.Message != "closed" {
				t.Fatalf("exit = %+v", fc.Exit)
			}

			st, err = fabricnet.OpenRaw(ctx, cp, preamble(uuid.NewString(), alloc, "/bin/sh", "-c", `echo "over-$((10*10))"; exit 5`))
			if err != nil {
				t.Fatal(err)
			}
			_ = st.SetDeadline(time.Now().Add(waitLimit))
			fc = NewFrameConn(st)
			out, err := io.ReadAll(fc)
			if err != nil || !strings.Contains(string(out), "over-100") {
				t.Fatalf("output %q, %v", out, err)
			}
			if fc.Exit == nil || *fc.Exit.Code != 5 {
				t.Fatalf("exit = %+v", fc.Exit)
			}
		})
	}
}

// The baseline measurement: a PTY on this host with nothing in between.
func TestLocalEcho(t *testing.T) {
	rw, err := LocalEcho()
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	rtts, err := EchoRoundTrip(rw, 30)
	if err != nil || len(rtts) != 30 {
		t.Fatalf("%d round trips, %v", len(rtts), err)
	}
	for _, d := range rtts {
		if d <= 0 {
			t.Fatalf("round trip %v", d)
		}
	}
}

func TestReadUntil(t *testing.T) {
	r := io.MultiReader(strings.NewReader("xxDO"), strings.NewReader("NEyy"))
	n, err := ReadUntil(r, []byte("DONE"))
	if err != nil || n != 8 {
		t.Fatalf("ReadUntil = %d, %v", n, err)
	}
	if _, err := ReadUntil(strings.NewReader("no marker"), []byte("DONE")); err != io.EOF {
		t.Fatalf("without the marker: %v", err)
	}
}

// A session's stream that ends while the output pump is blocked writing to it (the
// control plane stopped reading during a flood, then half-closed) detaches the session
// and frees the pump: the agent's Close returns. Over QUIC, quic-go's own Close under a
// blocked Write left the pump, the session and the agent's shutdown stuck for good.
func TestStreamEndedUnderABlockedWriteFreesTheSession(t *testing.T) {
	for _, mode := range []fabricnet.Mode{fabricnet.ModeQUIC, fabricnet.ModeTCP} {
		t.Run(string(mode), func(t *testing.T) {
			e := &envs{m: map[string]SessionEnv{}}
			alloc := uuid.NewString()
			e.set(alloc, testEnv(t, alloc))
			// Not closed in a cleanup: a regression would hang it, and the test fails
			// below instead.
			srv := New(e, Options{})
			cp := tunnel(t, srv, mode)
			ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
			defer cancel()
			id := uuid.NewString()
			st, err := fabricnet.OpenRaw(ctx, cp, preamble(id, alloc, "/bin/sh", "-c", `cat /dev/zero | tr '\0' x`))
			if err != nil {
				t.Fatal(err)
			}
			var sess *session
			waitFor(t, "the session", func() bool { sess = srv.session(id); return sess != nil })
			// Nobody reads: the windows fill and the pump blocks in its write.
			for last := int64(-1); ; {
				time.Sleep(100 * time.Millisecond)
				if ctx.Err() != nil {
					t.Fatal("the output pump never blocked")
				}
				if n := sess.handledBytes.Load(); n == last && sess.readBytes.Load() > n {
					break
				} else {
					last = n
				}
			}
			// End the sending side only, as a peer that half-closes does: the agent's
			// reader sees the end and closes the stream while the write is blocked.
			if cw, ok := st.(interface{ CloseWrite() error }); ok {
				_ = cw.CloseWrite()
			} else {
				_ = st.Close()
			}
			waitFor(t, "the session detached", func() bool { return sess.state() == stateDetached })
			closed := make(chan struct{})
			go func() { srv.Close(); close(closed) }()
			select {
			case <-closed:
			case <-time.After(waitLimit):
				t.Fatalf("the agent's Close is still waiting on the session %s after the stream ended (pump blocked in its write)", waitLimit)
			}
		})
	}
}
