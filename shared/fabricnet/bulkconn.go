package fabricnet

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// Bulk connections. A raw read stream on a TLS+yamux session costs, besides the TLS
// work and the syscalls, yamux's own handling of every byte: the control plane's frames
// copied into the writer's queue and handed from the stream's writer to the send loop to
// the drain goroutine, and on the agent every frame copied into the stream's receive
// buffer by the session's receive loop and out of it again by the reader (a CPU profile
// of an attachment read: 21 % in that copy alone, docs/storage.md). A bulk connection is
// a TLS+TCP connection, negotiated with its own ALPN (ALPNBulk) on the fabric's TCP
// port, that carries exactly one agent-opened raw stream and nothing else: the auth
// exchange (AuthRequest.bulk_for_session_id names the node's live main session, checked
// as for a bulk side session), then the stream's bytes as they are, read and written by
// the stream's own goroutine straight through TLS. The agent opens one per raw stream
// and reuses it range after range as it reuses streams; TLS session resumption keeps
// the handshakes cheap.

// ALPNBulk is the TLS application protocol of a bulk connection (TCP only).
const ALPNBulk = "gantry-fabric-bulk/1"

// connSession is one bulk connection as a Session: its first stream (opened by the
// agent, accepted by the control plane) is the auth stream, its second the raw stream;
// both are the connection itself, one after the other. Closing the auth stream leaves
// the connection open; closing the raw stream, or the session, closes it.
type connSession struct {
	tls  *tls.Conn
	raw  *corkConn
	done chan struct{}

	mu      sync.Mutex
	streams int // streams opened or accepted so far
	closed  bool
}

func newConnSession(tc *tls.Conn, raw *corkConn) *connSession {
	return &connSession{tls: tc, raw: raw, done: make(chan struct{})}
}

// IsBulkConn says whether s is a bulk connection (ALPNBulk), not a tunnel: the control
// plane serves it only as a bulk connection of a live main session.
func IsBulkConn(s Session) bool {
	_, ok := s.(*connSession)
	return ok
}

func (s *connSession) next() (net.Conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrSessionClosed
	}
	if s.streams >= 2 {
		return nil, errors.New("fabricnet: a bulk connection carries one raw stream")
	}
	s.streams++
	return &connStream{s: s, auth: s.streams == 1}, nil
}

func (s *connSession) OpenStream(ctx context.Context) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.next()
}

// AcceptStream returns the auth stream, then the raw stream (their first bytes have
// not necessarily arrived), then waits for the connection to end.
func (s *connSession) AcceptStream(ctx context.Context) (net.Conn, error) {
	s.mu.Lock()
	more := s.streams < 2
	s.mu.Unlock()
	if more {
		return s.next()
	}
	select {
	case <-s.done:
		return nil, ErrSessionClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (s *connSession) Transport() Transport     { return TransportTCP }
func (s *connSession) LocalAddr() net.Addr      { return s.tls.LocalAddr() }
func (s *connSession) RemoteAddr() net.Addr     { return s.tls.RemoteAddr() }
func (s *connSession) TLS() tls.ConnectionState { return s.tls.ConnectionState() }
func (s *connSession) Done() <-chan struct{}    { return s.done }

func (s *connSession) Err() error {
	select {
	case <-s.done:
		return ErrSessionClosed
	default:
		return nil
	}
}

// Close closes the TCP connection (no close_notify: it would wait for a Write under way;
// a raw stream's reader knows how many bytes it is owed, so a cut is always seen).
func (s *connSession) Close(string) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	s.mu.Unlock()
	return s.raw.Conn.Close()
}

// connStream is a stream of a bulk connection: the connection itself.
type connStream struct {
	s    *connSession
	auth bool
}

func (c *connStream) Read(p []byte) (int, error) { return c.s.tls.Read(p) }

// Write gathers the TLS records of a large write (one per 16 KiB) into one socket write,
// as the tunnel's writer does for a yamux frame: a raw read stream writes 256 KiB at a
// time, which would otherwise be sixteen syscalls and as many wakeups of the reader.
func (c *connStream) Write(p []byte) (int, error) {
	if len(p) <= 16<<10 {
		return c.s.tls.Write(p)
	}
	c.s.raw.cork()
	n, err := c.s.tls.Write(p)
	if uerr := c.s.raw.uncork(); err == nil {
		err = uerr
	}
	return n, err
}

// Close ends the connection, unless this is the auth stream, which the raw stream
// follows on the same connection.
func (c *connStream) Close() error {
	if c.auth {
		return nil
	}
	return c.s.Close("raw stream closed")
}

func (c *connStream) LocalAddr() net.Addr                { return c.s.tls.LocalAddr() }
func (c *connStream) RemoteAddr() net.Addr               { return c.s.tls.RemoteAddr() }
func (c *connStream) SetDeadline(t time.Time) error      { return c.s.tls.SetDeadline(t) }
func (c *connStream) SetReadDeadline(t time.Time) error  { return c.s.tls.SetReadDeadline(t) }
func (c *connStream) SetWriteDeadline(t time.Time) error { return c.s.tls.SetWriteDeadline(t) }

// DialBulkConn opens one bulk connection to addr (the fabric's TCP port) and
// authenticates req, which must name the main session (BulkForSessionId). The returned
// Session's next OpenStream is the raw stream (OpenAgentStream); closing that stream
// closes the connection. A control plane that does not know bulk connections fails the
// TLS handshake (no common application protocol).
func DialBulkConn(ctx context.Context, addr string, tlsConf *tls.Config, opts *DialOptions, req *fabricv1.AuthRequest) (Session, error) {
	if req.GetBulkForSessionId() == "" {
		return nil, errors.New("fabricnet: bulk connection without a main session id")
	}
	var o DialOptions
	if opts != nil {
		o = *opts
	}
	c, err := tcpConn(ctx, addr, &o)
	if err != nil {
		return nil, err
	}
	conf := clientTLS(tlsConf, addr)
	conf.NextProtos = []string{ALPNBulk}
	raw := &corkConn{Conn: c}
	tc := tls.Client(raw, conf)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = c.Close()
		return nil, err
	}
	if p := tc.ConnectionState().NegotiatedProtocol; p != ALPNBulk {
		_ = c.Close()
		return nil, fmt.Errorf("fabricnet: bulk connection negotiated %q", p)
	}
	s := newConnSession(tc, raw)
	if _, err := Authenticate(ctx, s, req); err != nil {
		_ = s.Close("bulk connection refused")
		return nil, err
	}
	return s, nil
}

// BulkConns is a Session whose every OpenStream is a new bulk connection (DialBulkConn):
// what the agent hands its bulk stream users in place of a side session (SideDialer).
// Close closes every connection it opened that is still open.
type BulkConns struct {
	dial func(ctx context.Context) (Session, error)
	done chan struct{}

	mu     sync.Mutex
	live   map[*connSession]struct{}
	spare  *connSession // the probe's connection, for the first stream
	spareT time.Time
	closed bool
}

// spareFor is how long the probe's connection waits for a stream: less than the control
// plane waits for a raw stream's first byte (10 s).
const spareFor = 5 * time.Second

// NewBulkConns dials one bulk connection with dial (the probe: it shows the control
// plane takes them and the TCP path is open) and returns the set, the probe's connection
// kept for the first stream.
func NewBulkConns(ctx context.Context, dial func(ctx context.Context) (Session, error)) (*BulkConns, error) {
	b := &BulkConns{dial: dial, done: make(chan struct{}), live: map[*connSession]struct{}{}}
	cs, err := b.dialConn(ctx)
	if err != nil {
		return nil, err
	}
	b.spare, b.spareT = cs, time.Now()
	b.track(cs)
	return b, nil
}

// dialConn dials one bulk connection.
func (b *BulkConns) dialConn(ctx context.Context) (*connSession, error) {
	s, err := b.dial(ctx)
	if err != nil {
		return nil, err
	}
	cs, ok := s.(*connSession)
	if !ok {
		_ = s.Close("not a bulk connection")
		return nil, errors.New("fabricnet: dial did not return a bulk connection")
	}
	return cs, nil
}

func (b *BulkConns) track(cs *connSession) {
	b.live[cs] = struct{}{}
	go func() {
		select {
		case <-cs.done:
			b.mu.Lock()
			delete(b.live, cs)
			if b.spare == cs {
				b.spare = nil
			}
			b.mu.Unlock()
		case <-b.done:
		}
	}()
}

// OpenStream returns the raw stream of a new bulk connection (or of the probe's, while
// fresh).
func (b *BulkConns) OpenStream(ctx context.Context) (net.Conn, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, ErrSessionClosed
	}
	cs := b.spare
	b.spare = nil
	if cs != nil && time.Since(b.spareT) >= spareFor {
		_ = cs.Close("spare bulk connection stale")
		cs = nil
	}
	b.mu.Unlock()
	if cs == nil {
		var err error
		if cs, err = b.dialConn(ctx); err != nil {
			return nil, err
		}
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			_ = cs.Close("bulk connections closed")
			return nil, ErrSessionClosed
		}
		b.track(cs)
		b.mu.Unlock()
	}
	return cs.OpenStream(ctx)
}

func (b *BulkConns) AcceptStream(ctx context.Context) (net.Conn, error) {
	return nil, errors.New("fabricnet: bulk connections accept no streams")
}

func (b *BulkConns) Transport() Transport     { return TransportTCP }
func (b *BulkConns) LocalAddr() net.Addr      { return nil }
func (b *BulkConns) RemoteAddr() net.Addr     { return nil }
func (b *BulkConns) TLS() tls.ConnectionState { return tls.ConnectionState{} }
func (b *BulkConns) Done() <-chan struct{}    { return b.done }

func (b *BulkConns) Err() error {
	select {
	case <-b.done:
		return ErrSessionClosed
	default:
		return nil
	}
}

// Close closes every bulk connection of the set still open.
func (b *BulkConns) Close(string) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	close(b.done)
	live := b.live
	b.live, b.spare = nil, nil
	b.mu.Unlock()
	for cs := range live {
		_ = cs.Close("bulk connections closed")
	}
	return nil
}
