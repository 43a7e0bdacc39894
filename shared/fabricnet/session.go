package fabricnet

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/quic-go/quic-go"
)

// ALPN is the TLS application protocol of the fabric, on QUIC and on TCP alike.
const ALPN = "gantry-fabric/1"

// Transport names how a Session is carried.
type Transport string

const (
	TransportQUIC Transport = "quic"
	TransportTCP  Transport = "tcp" // TLS over TCP, multiplexed with yamux
)

// ErrSessionClosed is returned by OpenStream / AcceptStream on a closed session.
var ErrSessionClosed = errors.New("fabricnet: session closed")

// Session is one tunnel between an agent and the control plane. Either side may open
// streams; streams are full-duplex net.Conns. A Session is safe for concurrent use.
type Session interface {
	// OpenStream opens a new stream. On QUIC the peer sees it only once a byte has been
	// written on it.
	OpenStream(ctx context.Context) (net.Conn, error)
	// AcceptStream waits for the next stream the peer opens.
	AcceptStream(ctx context.Context) (net.Conn, error)
	// Transport says whether this is QUIC or TLS+yamux.
	Transport() Transport
	LocalAddr() net.Addr
	RemoteAddr() net.Addr
	// TLS is the tunnel's TLS connection state (peer certificates, ALPN).
	TLS() tls.ConnectionState
	// Close ends the tunnel and every stream on it. reason goes to the peer on QUIC
	// (application close) and to logs; keep it short and free of secrets.
	Close(reason string) error
	// Done is closed when the tunnel has ended, from either side.
	Done() <-chan struct{}
	// Err says why the tunnel ended once Done is closed (nil before). On QUIC it is
	// quic-go's error: a *quic.StatelessResetError when a control plane that crashed is
	// back and reset the tunnel, a *quic.IdleTimeoutError when the peer went silent, a
	// *quic.ApplicationError for a close with a reason. On TLS+yamux it is
	// ErrSessionClosed (yamux keeps no reason).
	Err() error
}

// ---------------------------------------------------------------------------------------
// QUIC

type quicSession struct {
	conn *quic.Conn
	// tr is set on the dialling side, which owns its UDP socket.
	tr *quic.Transport
	// closeOnce guards tr.
	closeOnce sync.Once
}

func newQUICSession(c *quic.Conn, tr *quic.Transport) *quicSession {
	s := &quicSession{conn: c, tr: tr}
	if tr != nil {
		go func() {
			<-c.Context().Done()
			s.closeTransport()
		}()
	}
	return s
}

func (s *quicSession) closeTransport() {
	s.closeOnce.Do(func() {
		if s.tr != nil {
			_ = s.tr.Close()
			_ = s.tr.Conn.Close()
		}
	})
}

func (s *quicSession) OpenStream(ctx context.Context) (net.Conn, error) {
	st, err := s.conn.OpenStreamSync(ctx)
	if err != nil {
		return nil, s.wrapErr(err)
	}
	return &quicStream{Stream: st, conn: s.conn}, nil
}

func (s *quicSession) AcceptStream(ctx context.Context) (net.Conn, error) {
	st, err := s.conn.AcceptStream(ctx)
	if err != nil {
		return nil, s.wrapErr(err)
	}
	return &quicStream{Stream: st, conn: s.conn}, nil
}

func (s *quicSession) wrapErr(err error) error {
	if s.conn.Context().Err() != nil {
		return errors.Join(ErrSessionClosed, err)
	}
	return err
}

func (s *quicSession) Transport() Transport     { return TransportQUIC }
func (s *quicSession) LocalAddr() net.Addr      { return s.conn.LocalAddr() }
func (s *quicSession) RemoteAddr() net.Addr     { return s.conn.RemoteAddr() }
func (s *quicSession) TLS() tls.ConnectionState { return s.conn.ConnectionState().TLS }
func (s *quicSession) Done() <-chan struct{}    { return s.conn.Context().Done() }
func (s *quicSession) Err() error               { return context.Cause(s.conn.Context()) }

func (s *quicSession) Close(reason string) error {
	err := s.conn.CloseWithError(0, reason)
	s.closeTransport()
	return err
}

// quicStream makes a QUIC stream a net.Conn: addresses from its connection, and Close
// ending both directions (quic-go's Close only ends the sending side) and, as net.Conn
// promises, unblocking a Write in progress.
//
// quic-go's Close must not run concurrently with Write: it marks the sending side
// finished, and a Write already waiting for flow-control credit then waits for good (the
// connection's shutdown skips a finished stream, and a peer that stopped reading never
// sends credit). A terminal session's output pump blocked on a browser that went away
// hung that way while the session's reader closed the stream. Writes therefore hold wmu;
// Close takes it when no Write is under way, and otherwise resets the sending side
// (CancelWrite), which returns the blocked Write with an error.
type quicStream struct {
	*quic.Stream
	conn *quic.Conn
	wmu  sync.Mutex
}

func (s *quicStream) LocalAddr() net.Addr  { return s.conn.LocalAddr() }
func (s *quicStream) RemoteAddr() net.Addr { return s.conn.RemoteAddr() }

func (s *quicStream) Write(p []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.Stream.Write(p)
}

// CloseWrite ends the sending side only (FIN) after the Write under way, if any; the
// stream stays readable.
func (s *quicStream) CloseWrite() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.Stream.Close()
}

func (s *quicStream) Close() error {
	s.Stream.CancelRead(0)
	if !s.wmu.TryLock() {
		// A Write is under way, possibly blocked on a peer that no longer reads: what it
		// has not sent cannot be delivered once the stream is closed anyway.
		s.Stream.CancelWrite(0)
		return nil
	}
	defer s.wmu.Unlock()
	return s.Stream.Close()
}

// ---------------------------------------------------------------------------------------
// TLS over TCP + yamux

type yamuxSession struct {
	mux *yamux.Session
	tls *tls.Conn
}

func (s *yamuxSession) OpenStream(ctx context.Context) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	st, err := s.mux.OpenStream()
	if err != nil {
		return nil, s.wrapErr(err)
	}
	return st, nil
}

func (s *yamuxSession) AcceptStream(ctx context.Context) (net.Conn, error) {
	st, err := s.mux.AcceptStreamWithContext(ctx)
	if err != nil {
		return nil, s.wrapErr(err)
	}
	return st, nil
}

func (s *yamuxSession) wrapErr(err error) error {
	if s.mux.IsClosed() {
		return errors.Join(ErrSessionClosed, err)
	}
	return err
}

func (s *yamuxSession) Transport() Transport     { return TransportTCP }
func (s *yamuxSession) LocalAddr() net.Addr      { return s.tls.LocalAddr() }
func (s *yamuxSession) RemoteAddr() net.Addr     { return s.tls.RemoteAddr() }
func (s *yamuxSession) TLS() tls.ConnectionState { return s.tls.ConnectionState() }
func (s *yamuxSession) Done() <-chan struct{}    { return s.mux.CloseChan() }

func (s *yamuxSession) Err() error {
	if s.mux.IsClosed() {
		return ErrSessionClosed
	}
	return nil
}

func (s *yamuxSession) Close(string) error {
	// Close the TCP connection first, then the yamux session (no TLS close_notify: the
	// peer sees the connection end either way). yamux v0.1.2's Session.Close closes its
	// shutdown channel, then closes the connection and waits for it, and only then marks
	// the streams closed; in between, every stream reader (gRPC's, one per tunnel) spins
	// in Stream.Read on the closed channel. With thousands of tunnels closing at once
	// that spin ate the CPU that the connection closes were waiting for: stopping 5,000
	// tunnels took 25-35 s. With the connection already gone, the session's receive loop
	// ends at once and the streams are marked closed right after the channel closes.
	_ = s.tls.NetConn().Close()
	return s.mux.Close()
}

// ---------------------------------------------------------------------------------------
// Defaults shared by both ends.

const (
	// keepAlive keeps NAT bindings and idle tunnels alive: a side that has received
	// nothing for this long sends a PING, which the peer acknowledges.
	keepAlive = 5 * time.Second
	// idleTimeout ends a tunnel the peer stopped answering on (both sides offer it; QUIC
	// takes the smaller). It bounds how long an agent keeps a tunnel to a control plane
	// that crashed when the restarted one's stateless reset does not reach it: quic-go
	// queues at most 4 resets and drops the rest, and during a reconnect storm most
	// are dropped (1,400 for 2,000 agents in the bench); an agent whose reset was lost
	// sends again only at its next probe, and its probe timeout doubles each time, so
	// without this bound some agents waited up to 30 s, and at 45 s (before) some
	// waited out the timeout itself. With keep-alives every 5 s a live control plane
	// is never silent for 15 s: at 10,000 agents per replica that is 2,000 PINGs and
	// 2,000 ACKs a second, each a packet of about 40 bytes.
	idleTimeout = 15 * time.Second
	// tcpKeepAlive spaces yamux's pings on TLS+yamux, where the kernel tells an agent
	// of a crashed control plane (its connections are closed or reset) and the pings
	// only keep NAT bindings alive.
	tcpKeepAlive = 15 * time.Second
	// grpcKeepAlive is how long an agent's gRPC client on a QUIC tunnel stays silent
	// before it pings (GRPCClient); the fabric server permits pings every 5 s.
	grpcKeepAlive = 15 * time.Second
)

func quicConfig(base *quic.Config) *quic.Config {
	var c quic.Config
	if base != nil {
		c = *base
	}
	if c.KeepAlivePeriod == 0 {
		c.KeepAlivePeriod = keepAlive
	}
	if c.MaxIdleTimeout == 0 {
		c.MaxIdleTimeout = idleTimeout
	}
	if c.HandshakeIdleTimeout == 0 {
		c.HandshakeIdleTimeout = 10 * time.Second
	}
	if c.MaxIncomingStreams == 0 {
		c.MaxIncomingStreams = 1024
	}
	// Start the flow-control windows where a bulk stream needs them on a fast link
	// instead of growing them from quic-go's 512 KiB over several round trips; like
	// yamux's, the buffers behind them fill only with unread data.
	if c.InitialStreamReceiveWindow == 0 {
		c.InitialStreamReceiveWindow = 2 << 20
	}
	if c.InitialConnectionReceiveWindow == 0 {
		c.InitialConnectionReceiveWindow = 4 << 20
	}
	return &c
}

func yamuxConfig(base *yamux.Config) *yamux.Config {
	var c *yamux.Config
	if base != nil {
		c = base.Clone()
	} else {
		c = yamux.DefaultConfig()
		c.KeepAliveInterval = tcpKeepAlive
		c.ConnectionWriteTimeout = 10 * time.Second
		c.StreamOpenTimeout = 30 * time.Second
		c.StreamCloseTimeout = time.Minute
		// yamux's 256 KiB stream window caps one stream at window/RTT; 1 MiB lets a
		// bulk stream (a large terminal output, a file over the app proxy) fill a fast
		// link. Receive buffers grow only with unread data, so idle tunnels cost nothing.
		c.MaxStreamWindowSize = 1 << 20
	}
	c.LogOutput = nil
	if c.Logger == nil {
		c.Logger = discardLogger{}
	}
	return c
}

type discardLogger struct{}

func (discardLogger) Print(...any)          {}
func (discardLogger) Printf(string, ...any) {}
func (discardLogger) Println(...any)        {}

func withALPN(c *tls.Config) *tls.Config {
	c = c.Clone()
	c.NextProtos = []string{ALPN}
	if c.MinVersion < tls.VersionTLS13 {
		c.MinVersion = tls.VersionTLS13
	}
	return c
}

// FleetWideEnd reports whether a tunnel's end (its Session.Err) is one that every agent
// of the control plane may have seen at the same moment, so that agents reconnecting at
// once would arrive together: the control plane closed the tunnel (a graceful stop
// closes all of them at once), or, on TLS+yamux, the connection ended (the kernel of a
// crashed control plane closes them all at once). A QUIC tunnel ended by a stateless
// reset or an idle timeout is not: after a crash each agent learns of it at its own
// next packet or keep-alive, so the fleet's reconnects are spread over the keep-alive
// interval already. A tunnel this side closed itself (nil, or a local close) is not
// either.
func FleetWideEnd(ended error) bool {
	var app *quic.ApplicationError
	if errors.As(ended, &app) {
		return app.Remote
	}
	return errors.Is(ended, ErrSessionClosed)
}
