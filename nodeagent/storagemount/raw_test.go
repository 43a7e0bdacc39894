package storagemount

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// How the test agent reaches the test StorageFabric server.
const (
	viaRaw   = "raw"   // a session whose control plane serves raw read streams (the default)
	viaGRPC  = "grpc"  // a gRPC connection only (Conns.Set): reads use StorageFabric.Read
	viaOldCP = "oldcp" // a session whose control plane predates raw streams
)

// pipeSession is a fabricnet.Session whose streams are in-memory pipes to the test
// server, routed as the control plane's fabric server routes them: a raw stream to
// memStore.serveRaw (or, for an old control plane, to the gRPC server, which drops
// it), anything else to the gRPC server.
type pipeSession struct {
	store *memStore
	raw   bool
	// side marks a bulk side session: it serves raw streams only (counted in
	// memStore.sideStreams), as the control plane's does.
	side bool
	grpc *fabricnet.StreamListener
	done chan struct{}
	once sync.Once
}

func (s *pipeSession) OpenStream(ctx context.Context) (net.Conn, error) {
	select {
	case <-s.done:
		return nil, fabricnet.ErrSessionClosed
	default:
	}
	agent, cp := net.Pipe()
	go func() {
		conn, kind, raw, err := fabricnet.PeekAgentStream(cp)
		if err != nil {
			_ = cp.Close()
			return
		}
		if raw && s.raw && kind == fabricnet.AgentStreamStorageRead {
			defer cp.Close()
			if s.side {
				s.store.mu.Lock()
				s.store.sideStreams++
				s.store.mu.Unlock()
			}
			s.store.serveRaw(cp)
			return
		}
		if s.side {
			_ = cp.Close() // no gRPC on a side session
			return
		}
		if raw {
			conn = cp // an old control plane's gRPC server gets the raw bytes and drops them
		}
		s.grpc.Push(context.Background(), conn)
	}()
	return agent, nil
}

func (s *pipeSession) AcceptStream(ctx context.Context) (net.Conn, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
func (s *pipeSession) Transport() fabricnet.Transport { return fabricnet.TransportTCP }
func (s *pipeSession) LocalAddr() net.Addr            { return pipeAddr{} }
func (s *pipeSession) RemoteAddr() net.Addr           { return pipeAddr{} }
func (s *pipeSession) TLS() tls.ConnectionState       { return tls.ConnectionState{} }
func (s *pipeSession) Close(string) error {
	s.once.Do(func() { close(s.done) })
	return nil
}
func (s *pipeSession) Done() <-chan struct{} { return s.done }
func (s *pipeSession) Err() error            { return nil }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// serveTunnel serves s over a pipeSession; raw says whether raw read streams are
// served. It returns the session's gRPC connection, the session (closed at cleanup) and
// no side dialer (sideDialer makes one).
func (s *memStore) serveTunnel(t testing.TB, raw bool) (*grpc.ClientConn, fabricnet.Session, fabricnet.SideDialer) {
	t.Helper()
	sess := &pipeSession{store: s, raw: raw, grpc: fabricnet.NewStreamListener(pipeAddr{}), done: make(chan struct{})}
	srv := grpc.NewServer()
	fabricv1.RegisterStorageFabricServer(srv, s)
	go func() { _ = srv.Serve(sess.grpc) }()
	cc, err := fabricnet.GRPCClient(sess)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cc.Close()
		srv.Stop()
		_ = sess.Close("test over")
	})
	return cc, sess, nil
}

// sideDialer opens bulk side sessions (pipeSessions serving raw streams only) and
// keeps each for the test to inspect; fail, while set, makes the dial fail as a
// blocked TCP path does.
type sideDialer struct {
	store  *memStore
	mu     sync.Mutex
	opened []*pipeSession
	fail   bool
}

func (d *sideDialer) dial(ctx context.Context) (fabricnet.Session, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail {
		return nil, errors.New("tcp blocked")
	}
	s := &pipeSession{store: d.store, raw: true, side: true, done: make(chan struct{})}
	d.opened = append(d.opened, s)
	return s, nil
}

func (d *sideDialer) sessions() []*pipeSession {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*pipeSession(nil), d.opened...)
}

// serveRaw is the test double of attach.FabricServer.ServeRawRead: the same checks as
// Read, then the reply, the info frame and the range's bytes; a read told to break
// (breakReads) ends after its first piece, short.
func (s *memStore) serveRaw(st net.Conn) {
	s.mu.Lock()
	s.rawStreams++
	s.mu.Unlock()
	for {
		var r fabricv1.StorageReadRequest
		if err := fabricnet.ReadFrame(st, &r); err != nil {
			return
		}
		if !s.serveRawRange(st, &r) {
			return
		}
	}
}

// serveRawRange answers one request of a raw read stream; false ends the stream.
func (s *memStore) serveRawRange(st net.Conn, r *fabricv1.StorageReadRequest) bool {
	refuse := func(err error) bool {
		e := status.Convert(err)
		return fabricnet.WriteReply(st, &fabricv1.StreamReply{Ok: false, ErrorCode: e.Code().String(), Message: e.Message()}) == nil
	}
	if err := s.check(r.GetAttachmentId(), false); err != nil {
		return refuse(err)
	}
	if err := checkPath(r.GetPath()); err != nil {
		return refuse(err)
	}
	s.mu.Lock()
	o, ok := s.objects[r.GetPath()]
	s.reads = append(s.reads, readReq{r.GetOffset(), r.GetLength()})
	s.rawReads++
	brk := s.breakReads > 0
	if brk {
		s.breakReads--
	}
	s.readsLive++
	s.readsPeak = max(s.readsPeak, s.readsLive)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.readsLive--
		s.mu.Unlock()
	}()
	if !ok {
		return refuse(status.Error(codes.NotFound, "no such object"))
	}
	if r.GetIfMatch() != "" && r.GetIfMatch() != o.etag {
		return refuse(status.Error(codes.FailedPrecondition, "etag changed"))
	}
	size := o.size()
	off := min(max(r.GetOffset(), 0), size)
	end := size
	if r.GetLength() > 0 {
		end = min(size, off+r.GetLength())
	}
	if fabricnet.WriteReply(st, &fabricv1.StreamReply{Ok: true}) != nil || fabricnet.WriteFrame(st, o.info(r.GetPath())) != nil {
		return false
	}
	buf := make([]byte, 64<<10)
	for off < end {
		n := min(int64(len(buf)), end-off)
		if o.synth > 0 {
			synthFill(buf[:n], off)
		} else {
			copy(buf, o.data[off:off+n])
		}
		if _, err := st.Write(buf[:n]); err != nil {
			return false
		}
		off += n
		if brk && off < end {
			return false // the stream ends owing bytes, as a broken tunnel's does
		}
	}
	return true
}

// TestRawReadRefusals: a refused raw read stream gives the control plane's code as a
// gRPC status (the FUSE errno mapping is the same as for StorageFabric.Read), and each
// read is a new stream the server checks.
func TestRawReadRefusals(t *testing.T) {
	e := newEnv(t, ModeCopy)
	e.store.put("a.txt", []byte("hello"))
	c := NewClient(e.conns)
	c.RetryFor, c.Backoff = 2*time.Second, 10*time.Millisecond
	ctx := context.Background()
	for _, tc := range []struct {
		att, path, ifMatch string
		want               codes.Code
	}{
		{attRO, "missing.txt", "", codes.NotFound},
		{"0190f6a0-0000-7000-8000-00000000dead", "a.txt", "", codes.PermissionDenied},
		{attRO, "../escape", "", codes.InvalidArgument},
		{attRO, "a.txt", `"other"`, codes.FailedPrecondition},
	} {
		if _, err := c.Open(ctx, tc.att, tc.path, 0, 0, tc.ifMatch); status.Code(err) != tc.want {
			t.Errorf("open %s %s: %v, want %v", tc.att, tc.path, err, tc.want)
		}
	}
	r, err := c.Open(ctx, attRO, "a.txt", 1, 3, "")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	if err != nil || string(got) != "ell" {
		t.Fatalf("range read: %q %v", got, err)
	}
	e.store.mu.Lock()
	raw := e.store.rawReads
	e.store.mu.Unlock()
	if raw == 0 {
		t.Fatal("no read went over a raw stream")
	}
}

// TestRawReadResumesAndFallsBack: a raw stream that ends owing bytes is resumed where
// it stopped (pinned to the version), and a control plane that does not serve raw
// streams is read through StorageFabric.Read after one try; the bytes are the object's
// either way.
func TestRawReadResumesAndFallsBack(t *testing.T) {
	const size = 5<<20 + 333
	for _, via := range []string{viaRaw, viaOldCP} {
		t.Run(via, func(t *testing.T) {
			e := newEnvVia(t, ModeCopy, via)
			e.store.putSynthetic("big.bin", size)
			e.store.breakReads = 2
			c := NewClient(e.conns)
			c.RetryFor, c.Backoff = 10*time.Second, 10*time.Millisecond
			for range 2 {
				r, err := c.Open(context.Background(), attRO, "big.bin", 0, 0, "")
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(r)
				r.Close()
				if err != nil || int64(len(got)) != size {
					t.Fatalf("read %d bytes: %v", len(got), err)
				}
				want := make([]byte, size)
				synthFill(want, 0)
				if string(got) != string(want) {
					t.Fatal("bytes differ from the object's")
				}
			}
			e.store.mu.Lock()
			raw, reads := e.store.rawReads, len(e.store.reads)
			e.store.mu.Unlock()
			switch via {
			case viaRaw:
				if raw != reads || raw < 4 { // 2 reads, 2 broken streams resumed
					t.Fatalf("%d raw of %d reads, want all raw and >= 4", raw, reads)
				}
				// The second whole read reused the stream the first one finished on.
				e.store.mu.Lock()
				streams := e.store.rawStreams
				e.store.mu.Unlock()
				if streams >= raw {
					t.Fatalf("%d raw streams for %d reads: none reused", streams, raw)
				}
			case viaOldCP:
				if raw != 0 || reads < 4 {
					t.Fatalf("%d raw of %d reads, want none raw and >= 4", raw, reads)
				}
			}
		})
	}
}

// TestRawReadsTakeTheBulkSide: with a side dialer (a QUIC tunnel whose control plane
// offers bulk side sessions), raw reads move to the side session once it is up, with
// the object's bytes; a dial that fails (TCP blocked) leaves them on the tunnel, and is
// not tried again on every read; a side session that breaks sends reads back to the
// tunnel; one left idle is closed and dialled again by the next read; a new tunnel
// closes the old tunnel's side session.
func TestRawReadsTakeTheBulkSide(t *testing.T) {
	const size = 5<<20 + 77
	want := make([]byte, size)
	synthFill(want, 0)
	setup := func(t *testing.T, fail bool) (*env, *Client, *sideDialer) {
		e := newEnv(t, ModeCopy)
		e.store.putSynthetic("big.bin", size)
		d := &sideDialer{store: e.store, fail: fail}
		cc, sess, _ := e.store.serveTunnel(t, true)
		e.conns.SetTunnel(cc, sess, d.dial)
		c := NewClient(e.conns)
		c.RetryFor, c.Backoff = 10*time.Second, 10*time.Millisecond
		return e, c, d
	}
	read := func(t *testing.T, c *Client) {
		t.Helper()
		r, err := c.Open(context.Background(), attRO, "big.bin", 0, 0, "")
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		got, err := io.ReadAll(r)
		if err != nil || string(got) != string(want) {
			t.Fatalf("read %d bytes (%v): not the object's", len(got), err)
		}
	}
	// counts: streams opened on side sessions, raw streams opened, ranges read raw.
	counts := func(e *env) (side, raw, reads int) {
		e.store.mu.Lock()
		defer e.store.mu.Unlock()
		return e.store.sideStreams, e.store.rawStreams, e.store.rawReads
	}

	t.Run("side", func(t *testing.T) {
		e, c, d := setup(t, false)
		read(t, c) // starts the dial; this read may stay on the tunnel
		deadline := time.Now().Add(10 * time.Second)
		for !e.conns.BulkStats().Up {
			if time.Now().After(deadline) {
				t.Fatal("side session not up")
			}
			time.Sleep(5 * time.Millisecond)
		}
		side0, raw0, _ := counts(e)
		read(t, c)
		side1, raw1, reads1 := counts(e)
		if side1 == side0 || side1-side0 != raw1-raw0 {
			t.Fatalf("second read opened %d streams, %d of them on the side session", raw1-raw0, side1-side0)
		}
		if st := e.conns.BulkStats(); st.Dials != 1 || st.Failures != 0 {
			t.Fatalf("bulk stats %+v, want one dial", st)
		}
		// The side session breaks: reads go back to the tunnel, and stay there for
		// bulkRetry instead of dialling again at once.
		_ = d.sessions()[0].Close("broken")
		read(t, c)
		side2, _, reads2 := counts(e)
		if side2 != side1 || reads2 == reads1 {
			t.Fatalf("after the side session broke: %d side streams, %d raw reads (before %d, %d)", side2, reads2, side1, reads1)
		}
		if st := e.conns.BulkStats(); st.Dials != 1 || st.Failures != 1 || st.Up {
			t.Fatalf("bulk stats after the break %+v", st)
		}
		// A new tunnel: the old one's side session ends with it.
		cc, sess, _ := e.store.serveTunnel(t, true)
		read(t, c)
		e.conns.SetTunnel(cc, sess, d.dial)
		for deadline := time.Now().Add(10 * time.Second); !e.conns.BulkStats().Up; {
			if time.Now().After(deadline) {
				t.Fatal("the new tunnel's side session not up")
			}
			read(t, c)
		}
		e.conns.SetTunnel(nil, nil, nil)
		all := d.sessions()
		select {
		case <-all[len(all)-1].Done():
		default:
			t.Fatal("the side session outlived its tunnel")
		}
	})

	t.Run("idle", func(t *testing.T) {
		e, c, d := setup(t, false)
		// Shortened: a side session with no stream in use for this long is closed. Long
		// enough that a loaded machine still sees it up first (200 ms was not: the
		// session came up and went idle between two looks under make test's load).
		e.conns.cur.bulk.idleAfter = time.Second
		waitFor := func(what string, cond func() bool) {
			t.Helper()
			for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("timed out waiting for %s", what)
				}
			}
		}
		read(t, c)
		waitFor("side session up", func() bool { return e.conns.BulkStats().Up })
		read(t, c)
		waitFor("side session closed when idle", func() bool { return !e.conns.BulkStats().Up })
		select {
		case <-d.sessions()[0].Done():
		default:
			t.Fatal("the idle side session was forgotten but not closed")
		}
		// Idle is no failure: the next read dials again at once.
		read(t, c)
		waitFor("a new side session", func() bool { return e.conns.BulkStats().Up })
		if st := e.conns.BulkStats(); st.Dials != 2 || st.Failures != 0 {
			t.Fatalf("bulk stats %+v, want two dials, no failure", st)
		}
	})

	t.Run("tcp blocked", func(t *testing.T) {
		e, c, d := setup(t, true)
		for range 3 {
			read(t, c)
		}
		side, raw, _ := counts(e)
		if side != 0 || raw == 0 || len(d.sessions()) != 0 {
			t.Fatalf("%d side, %d raw streams", side, raw)
		}
		if st := e.conns.BulkStats(); st.Dials != 1 || st.Failures != 1 || st.Up {
			t.Fatalf("bulk stats %+v, want one failed dial and no retry", st)
		}
	})
}
