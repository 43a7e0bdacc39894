package fabricnet_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// serveBulkConns plays the control plane for bulk connections: every accepted session
// that is a bulk connection naming "main" is authenticated (others are refused), then
// its raw stream answers one StorageReadRequest with length pattern bytes, written in
// 256 KiB writes. Sessions that are not bulk connections are reported on tunnels.
func serveBulkConns(ctx context.Context, ln *fabricnet.Listener, tunnels chan<- fabricnet.Session) {
	for {
		s, err := ln.Accept(ctx)
		if err != nil {
			return
		}
		if !fabricnet.IsBulkConn(s) {
			tunnels <- s
			continue
		}
		go func() {
			defer s.Close("done")
			auth, err := s.AcceptStream(ctx)
			if err != nil {
				return
			}
			var req fabricv1.AuthRequest
			if fabricnet.ReadFrame(auth, &req) != nil {
				return
			}
			if req.GetBulkForSessionId() != "main" {
				_ = fabricnet.WriteFrame(auth, &fabricv1.AuthResponse{Ok: false, ErrorCode: fabricnet.AuthErrSessionNotFound})
				return
			}
			if fabricnet.WriteFrame(auth, &fabricv1.AuthResponse{Ok: true}) != nil || auth.Close() != nil {
				return
			}
			st, err := s.AcceptStream(ctx)
			if err != nil {
				return
			}
			conn, kind, raw, err := fabricnet.PeekAgentStream(st)
			if err != nil || !raw || kind != fabricnet.AgentStreamStorageRead {
				return
			}
			var rr fabricv1.StorageReadRequest
			if fabricnet.ReadFrame(conn, &rr) != nil || fabricnet.WriteReply(conn, &fabricv1.StreamReply{Ok: true}) != nil {
				return
			}
			data := pattern(int(rr.GetLength()))
			for len(data) > 0 {
				n := min(len(data), 256<<10)
				if _, err := conn.Write(data[:n]); err != nil {
					return
				}
				data = data[n:]
			}
			// The stream stays open until the agent closes it (the connection ends then).
			_, _ = io.Copy(io.Discard, conn)
		}()
	}
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>11)
	}
	return b
}

// TestBulkConns: bulk connections and tunnels share the TCP port (the ALPN tells them
// apart); each OpenStream of a BulkConns set is its own authenticated connection that
// carries one raw stream with every byte (large writes gathered into few records'
// writes must not reorder or drop any); a refused auth fails the dial; closing the set
// closes the connections still open and refuses new streams.
func TestBulkConns(t *testing.T) {
	srvTLS, cliTLS := certs(t)
	ln, ctx := listenFor(t, srvTLS)
	tunnels := make(chan fabricnet.Session, 4)
	go serveBulkConns(ctx, ln, tunnels)
	addr := ln.Addr().String()

	// A yamux tunnel on the same port still negotiates the fabric's ALPN.
	tun, err := fabricnet.Dial(ctx, addr, fabricnet.ModeTCP, cliTLS, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Close("done")
	if tun.TLS().NegotiatedProtocol != fabricnet.ALPN || fabricnet.IsBulkConn(<-tunnels) {
		t.Fatalf("a tunnel on the TCP port: alpn %q", tun.TLS().NegotiatedProtocol)
	}

	if _, err := fabricnet.DialBulkConn(ctx, addr, cliTLS, nil, &fabricv1.AuthRequest{BulkForSessionId: "other"}); err == nil {
		t.Fatal("a refused bulk connection dialled")
	}
	if _, err := fabricnet.DialBulkConn(ctx, addr, cliTLS, nil, &fabricv1.AuthRequest{}); err == nil {
		t.Fatal("a bulk connection naming no session dialled")
	}

	dials := 0
	conns, err := fabricnet.NewBulkConns(ctx, func(ctx context.Context) (fabricnet.Session, error) {
		dials++
		return fabricnet.DialBulkConn(ctx, addr, cliTLS, nil, &fabricv1.AuthRequest{BulkForSessionId: "main"})
	})
	if err != nil {
		t.Fatal(err)
	}
	const size = 3<<20 + 12345
	want := pattern(size)
	var streams []net.Conn
	for range 3 {
		st, err := fabricnet.OpenAgentStream(ctx, conns, fabricnet.AgentStreamStorageRead, &fabricv1.StorageReadRequest{Length: size})
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, size)
		if _, err := io.ReadFull(st, got); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("raw stream on a bulk connection: %v, bytes equal %v", err, bytes.Equal(got, want))
		}
		streams = append(streams, st)
	}
	if dials != 3 {
		t.Fatalf("%d dials for 3 streams (the probe's connection serving the first), want 3", dials)
	}
	// Closing a stream ends its connection; the others end with the set.
	if err := streams[0].Close(); err != nil {
		t.Fatal(err)
	}
	_ = conns.Close("done")
	select {
	case <-conns.Done():
	default:
		t.Fatal("closed set not done")
	}
	if _, err := conns.OpenStream(ctx); !errors.Is(err, fabricnet.ErrSessionClosed) {
		t.Fatalf("OpenStream on a closed set: %v", err)
	}
	for i, st := range streams {
		_ = st.SetReadDeadline(time.Now().Add(10 * time.Second))
		var ne net.Error
		if _, err := st.Read(make([]byte, 1)); err == nil || (errors.As(err, &ne) && ne.Timeout()) {
			t.Fatalf("stream %d read after the set closed: %v", i, err)
		}
	}
}
