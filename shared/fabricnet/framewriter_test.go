package fabricnet

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"io"
	"math/big"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

func selfSigned(t *testing.T) (*tls.Config, *tls.Config) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"peer"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}},
		&tls.Config{RootCAs: pool, ServerName: "peer"}
}

// countingConn counts the writes that reach the socket.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) { c.writes.Add(1); return c.Conn.Write(p) }

// settle waits until f's drain goroutine wrote everything queued.
func settle(t *testing.T, f *frameConn) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		f.mu.Lock()
		idle := !f.running && len(f.queue) == 0
		f.mu.Unlock()
		if idle {
			return
		}
	}
	t.Fatal("frames still queued after 10s")
}

func dataHeader(length uint32) []byte {
	h := make([]byte, yamuxHeaderSize)
	h[1] = yamuxTypeData
	binary.BigEndian.PutUint32(h[4:8], 7)
	binary.BigEndian.PutUint32(h[8:12], length)
	return h
}

// The peer must read exactly the bytes yamux wrote, in its order, whatever follows a held
// header; a header with its body goes to the socket in one write.
func TestFrameConnKeepsTheByteStream(t *testing.T) {
	srvConf, cliConf := selfSigned(t)
	a, b := net.Pipe()
	counted := &countingConn{Conn: a}
	fc := newFrameConn(counted, cliConf, false)
	peer := tls.Server(b, srvConf)
	got := make(chan []byte, 1)
	go func() {
		data, _ := io.ReadAll(peer)
		got <- data
	}()
	if err := fc.Handshake(); err != nil {
		t.Fatal(err)
	}

	body := bytes.Repeat([]byte("x"), 300<<10) // above corkLimit: flushed in parts
	small := []byte("hello")
	window := make([]byte, yamuxHeaderSize) // a window update: type 1, never held
	window[1] = 1
	var want []byte
	write := func(p []byte) {
		t.Helper()
		if n, err := fc.Write(p); err != nil || n != len(p) {
			t.Fatalf("write %d bytes: n=%d err=%v", len(p), n, err)
		}
		want = append(want, p...)
	}

	before := counted.writes.Load()
	write(dataHeader(uint32(len(small))))
	write(small)
	settle(t, fc)
	if w := counted.writes.Load() - before; w != 1 {
		t.Fatalf("a small frame took %d socket writes, want 1", w)
	}
	write(window)
	write(dataHeader(uint32(len(body))))
	write(body)
	// A held header followed by something that is not its body (yamux drops the body of
	// a frame whose send timed out): the bytes still go out as written.
	write(dataHeader(10))
	write(window)
	write(dataHeader(0)) // no body announced: never held
	settle(t, fc)
	_ = fc.Close()
	if data := <-got; !bytes.Equal(data, want) {
		t.Fatalf("peer read %d bytes, want %d (equal prefix %v)", len(data), len(want), bytes.HasPrefix(want, data))
	}
}

func TestIsDataHeader(t *testing.T) {
	for _, tc := range []struct {
		p    []byte
		want bool
	}{
		{dataHeader(1), true},
		{dataHeader(0), false},
		{append(dataHeader(1), 0), false},
		{dataHeader(1)[:11], false},
		{func() []byte { h := dataHeader(5); h[1] = 2; return h }(), false},
	} {
		if got := isDataHeader(tc.p); got != tc.want {
			t.Errorf("isDataHeader(% x) = %v, want %v", tc.p, got, tc.want)
		}
	}
}

// Once the connection fails under the drain goroutine, yamux's next write gets the error
// (its send loop then ends the session) instead of queueing forever.
func TestFrameConnReportsAFailedConnection(t *testing.T) {
	srvConf, cliConf := selfSigned(t)
	a, b := net.Pipe()
	fc := newFrameConn(a, cliConf, false)
	peer := tls.Server(b, srvConf)
	go func() { _ = peer.Handshake() }()
	if err := fc.Handshake(); err != nil {
		t.Fatal(err)
	}
	_ = b.Close()
	window := make([]byte, yamuxHeaderSize)
	window[1] = 1
	for range 1000 {
		if _, err := fc.Write(window); err != nil {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("writes kept succeeding after the peer closed")
}

// Frames queued while the drain goroutine is writing go to the socket together: here the
// first frame's write blocks until the peer reads, and the ten small frames queued
// meanwhile take one socket write between them, not ten.
func TestFrameConnBatchesQueuedFrames(t *testing.T) {
	srvConf, cliConf := selfSigned(t)
	a, b := net.Pipe()
	counted := &countingConn{Conn: a}
	fc := newFrameConn(counted, cliConf, false)
	peer := tls.Server(b, srvConf)
	gate := make(chan struct{})
	got := make(chan []byte, 1)
	go func() {
		if err := peer.Handshake(); err != nil {
			got <- nil
			return
		}
		<-gate
		data, _ := io.ReadAll(peer)
		got <- data
	}()
	if err := fc.Handshake(); err != nil {
		t.Fatal(err)
	}
	var want []byte
	frame := func(body []byte) {
		for _, p := range [][]byte{dataHeader(uint32(len(body))), body} {
			if _, err := fc.Write(p); err != nil {
				t.Error(err)
				return
			}
			want = append(want, p...)
		}
	}
	before := counted.writes.Load()
	frame([]byte("first"))
	// The drain goroutine is now blocked in the first frame's socket write (net.Pipe
	// does not buffer), or about to be: the next frames queue behind it.
	queued := make(chan struct{})
	go func() {
		defer close(queued)
		for i := range 10 {
			frame([]byte{byte('a' + i)})
		}
	}()
	select {
	case <-queued:
	case <-time.After(10 * time.Second):
		close(gate)
		t.Fatal("small frames could not queue behind a blocked write")
	}
	close(gate)
	settle(t, fc)
	if w := counted.writes.Load() - before; w > 2 {
		t.Fatalf("11 frames took %d socket writes, want at most 2 (the first, then the rest together)", w)
	}
	_ = fc.Close()
	if data := <-got; !bytes.Equal(data, want) {
		t.Fatalf("peer read %q, want %q", data, want)
	}
}
