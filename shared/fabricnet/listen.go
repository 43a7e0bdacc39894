package fabricnet

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/quic-go/quic-go"
)

// ListenOptions tune Listen; the zero value (or nil) serves QUIC and TLS+yamux.
type ListenOptions struct {
	// DisableUDP serves TLS+yamux only (a deployment where UDP cannot reach the control
	// plane; tests of the TCP fallback).
	DisableUDP bool
	// DisableTCP serves QUIC only.
	DisableTCP bool
	// HandshakeTimeout bounds the TLS handshake of a TCP connection (default 10s).
	HandshakeTimeout time.Duration
	// MaxConcurrentHandshakes bounds TCP TLS handshakes in progress (default 4 per CPU).
	// When a whole fleet reconnects at once, unbounded handshakes share the CPU until
	// most of them time out; bounded, they complete in turn while the rest wait in the
	// kernel's accept queue.
	MaxConcurrentHandshakes int
	// MaxConcurrentQUICHandshakes, when positive, bounds QUIC handshakes in progress
	// (zero or negative: unbounded, quic-go's own behaviour and the default). quic-go
	// starts a handshake for every connection attempt at once; when a whole fleet
	// reconnects faster than the CPU completes handshakes, they all share it, each
	// finishes near the end of the storm, and the slowest run into their timeouts and
	// start over. An attempt over the bound is refused at its first packet with
	// CONNECTION_REFUSED, before any cryptography, and the agent retries later
	// (ServerBusy). Off by default: measured, the refused agents' retries (a new
	// ClientHello each) cost more than the collapse they avoid at 10,000 agents on a
	// small machine (docs/fabric.md, "Reconnect storms").
	MaxConcurrentQUICHandshakes int
	// QUIC and Yamux override the transport settings (nil: this package's defaults).
	QUIC  *quic.Config
	Yamux *yamux.Config
	// StatelessResetKey lets the QUIC transport answer a packet of a connection it does
	// not know with a stateless reset (RFC 9000 §10.3), which ends that connection at
	// its peer at once. The key must outlive the process: a control plane restarted
	// after a crash resets its agents' old tunnels only if it derives the same tokens as
	// the one that issued them. Without it (nil) the restarted listener drops their
	// packets and every agent waits out its idle timeout (15 s) before it reconnects.
	StatelessResetKey *quic.StatelessResetKey
}

// Listener accepts tunnels on one port number, over UDP (QUIC) and TCP (TLS+yamux).
type Listener struct {
	opts    ListenOptions
	tlsConf *tls.Config
	// tcpConf is tlsConf with bulk connections' ALPN too (ALPNBulk): TCP only.
	tcpConf  *tls.Config
	tcp      net.Listener
	udp      *net.UDPConn
	quicTr   *quic.Transport
	quicLn   *quic.Listener
	sessions chan Session
	// handshakes is the semaphore of TCP TLS handshakes in progress.
	handshakes chan struct{}
	// quicGate admits QUIC handshakes (MaxConcurrentQUICHandshakes).
	quicGate *handshakeGate

	// live holds the QUIC tunnels accepted and not yet ended. They cannot outlive the
	// UDP socket, and the transport's own close drops them without a word to the peer
	// (quic-go's destroy), which leaves every agent to its idle timeout (15 s) before it
	// reconnects: Close ends them with a CONNECTION_CLOSE first.
	liveMu sync.Mutex
	live   map[*quic.Conn]struct{}

	closeOnce sync.Once
	closed    chan struct{}
	wg        sync.WaitGroup
}

// Listen serves the fabric on addr ("host:port"). With port 0 it picks a port number
// that is free for both TCP and UDP (binding one, then the other, retrying on a
// conflict). tlsConf must carry the server certificate; ALPN and TLS 1.3 are set here.
func Listen(addr string, tlsConf *tls.Config, opts *ListenOptions) (*Listener, error) {
	l := &Listener{tlsConf: withALPN(tlsConf), sessions: make(chan Session, 256), closed: make(chan struct{}), live: map[*quic.Conn]struct{}{}}
	if opts != nil {
		l.opts = *opts
	}
	l.tcpConf = l.tlsConf.Clone()
	l.tcpConf.NextProtos = []string{ALPN, ALPNBulk}
	if l.opts.DisableTCP && l.opts.DisableUDP {
		return nil, errors.New("fabricnet: both TCP and UDP disabled")
	}
	if l.opts.HandshakeTimeout == 0 {
		l.opts.HandshakeTimeout = 10 * time.Second
	}
	if l.opts.MaxConcurrentHandshakes <= 0 {
		l.opts.MaxConcurrentHandshakes = 4 * runtime.GOMAXPROCS(0)
	}
	l.handshakes = make(chan struct{}, l.opts.MaxConcurrentHandshakes)
	if l.opts.MaxConcurrentQUICHandshakes <= 0 {
		l.opts.MaxConcurrentQUICHandshakes = math.MaxInt32 // unbounded (the default)
	}
	l.quicGate = newHandshakeGate(l.opts.MaxConcurrentQUICHandshakes)
	if err := l.bind(addr); err != nil {
		return nil, err
	}
	if l.udp != nil {
		l.quicTr = &quic.Transport{Conn: l.udp, StatelessResetKey: l.opts.StatelessResetKey, ConnContext: l.quicGate.admit}
		ln, err := l.quicTr.Listen(l.tlsConf, quicConfig(l.opts.QUIC))
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("fabricnet: quic listen: %w", err)
		}
		l.quicLn = ln
		l.wg.Add(1)
		go l.acceptQUIC()
	}
	if l.tcp != nil {
		l.wg.Add(1)
		go l.acceptTCP()
	}
	return l, nil
}

func (l *Listener) bind(addr string) error {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("fabricnet: listen address %q: %w", addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return fmt.Errorf("fabricnet: listen address %q: bad port", addr)
	}
	for attempt := 0; ; attempt++ {
		err := l.bindPort(host, port)
		if err == nil || port != 0 || attempt == 50 {
			return err
		}
	}
}

// bindPort binds TCP then UDP (each when enabled) on host:port; with port 0 the UDP
// socket takes the port number the kernel chose for TCP, and fails if it is taken.
func (l *Listener) bindPort(host string, port int) error {
	p := port
	if !l.opts.DisableTCP {
		tcp, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err != nil {
			return fmt.Errorf("fabricnet: listen tcp: %w", err)
		}
		l.tcp = tcp
		p = tcp.Addr().(*net.TCPAddr).Port
	}
	if !l.opts.DisableUDP {
		ua, err := net.ResolveUDPAddr("udp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err == nil {
			l.udp, err = net.ListenUDP("udp", ua)
		}
		if err != nil {
			if l.tcp != nil {
				_ = l.tcp.Close()
				l.tcp = nil
			}
			return fmt.Errorf("fabricnet: listen udp: %w", err)
		}
	}
	return nil
}

// QUICRefused is how many QUIC connection attempts the listener refused because
// MaxConcurrentQUICHandshakes were in progress (counted per packet: an attempt whose
// first flight spans two packets counts twice).
func (l *Listener) QUICRefused() int64 { return l.quicGate.refused.Load() }

// Addr is the address tunnels dial: the TCP address, whose port number the UDP socket
// shares (the UDP address when TCP is disabled).
func (l *Listener) Addr() net.Addr {
	if l.tcp != nil {
		return l.tcp.Addr()
	}
	return l.udp.LocalAddr()
}

// Accept waits for the next tunnel whose TLS handshake has completed. It returns
// net.ErrClosed after Close.
func (l *Listener) Accept(ctx context.Context) (Session, error) {
	select {
	case s := <-l.sessions:
		return s, nil
	case <-l.closed:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *Listener) deliver(s Session) {
	select {
	case <-l.closed:
		_ = s.Close("listener closed")
		return
	default:
	}
	select {
	case l.sessions <- s:
	case <-l.closed:
		_ = s.Close("listener closed")
	}
}

func (l *Listener) acceptQUIC() {
	defer l.wg.Done()
	for {
		c, err := l.quicLn.Accept(context.Background())
		if err != nil {
			return
		}
		// The handshake is complete: its slot goes to the next attempt.
		l.quicGate.done(c.Context())
		l.liveMu.Lock()
		if l.live == nil { // Close took the set: nobody will end this one
			l.liveMu.Unlock()
			_ = c.CloseWithError(0, "listener closed")
			return
		}
		l.live[c] = struct{}{}
		l.liveMu.Unlock()
		context.AfterFunc(c.Context(), func() {
			l.liveMu.Lock()
			delete(l.live, c)
			l.liveMu.Unlock()
		})
		l.deliver(newQUICSession(c, nil))
	}
}

func (l *Listener) acceptTCP() {
	defer l.wg.Done()
	for {
		c, err := l.tcp.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return
		}
		select {
		case l.handshakes <- struct{}{}:
		case <-l.closed:
			_ = c.Close()
			return
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			s, err := l.serverTLS(c)
			<-l.handshakes
			if err != nil {
				_ = c.Close()
				return
			}
			l.deliver(s)
		}()
	}
}

func (l *Listener) serverTLS(c net.Conn) (Session, error) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	fc := newFrameConn(c, l.tcpConf, true)
	ctx, cancel := context.WithTimeout(context.Background(), l.opts.HandshakeTimeout)
	defer cancel()
	if err := fc.HandshakeContext(ctx); err != nil {
		return nil, err
	}
	if fc.ConnectionState().NegotiatedProtocol == ALPNBulk {
		// One raw stream straight over TLS (bulkconn.go); frameConn's writer is unused.
		return newConnSession(fc.Conn, fc.raw), nil
	}
	mux, err := yamux.Server(fc, yamuxConfig(l.opts.Yamux))
	if err != nil {
		return nil, err
	}
	return &yamuxSession{mux: mux, tls: fc.Conn}, nil
}

// Close stops accepting. QUIC tunnels share the listener's UDP socket and end with it,
// their peers told (a CONNECTION_CLOSE, so agents reconnect at once); TCP tunnels
// already accepted stay up until their owner closes them, and those handed over but not
// yet accepted are closed.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		close(l.closed)
		if l.quicLn != nil {
			_ = l.quicLn.Close()
		}
		l.liveMu.Lock()
		live := l.live
		l.live = nil
		l.liveMu.Unlock()
		// In parallel: CloseWithError waits for the connection's loop to end, and a
		// replica may hold thousands.
		var wg sync.WaitGroup
		for c := range live {
			wg.Go(func() { _ = c.CloseWithError(0, "listener closed") })
		}
		wg.Wait()
		if l.quicTr != nil {
			_ = l.quicTr.Close()
		}
		if l.udp != nil {
			_ = l.udp.Close()
		}
		if l.tcp != nil {
			_ = l.tcp.Close()
		}
		// Tunnels handed over but never accepted would wait for their peers' timeouts.
		for drained := false; !drained; {
			select {
			case s := <-l.sessions:
				_ = s.Close("listener closed")
			default:
				drained = true
			}
		}
	})
	return nil
}
