package fabricnet

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/quic-go/quic-go"
)

// Mode chooses how Dial reaches the control plane.
type Mode string

const (
	// ModeAuto tries QUIC and falls back to TLS+yamux when nothing answers on UDP within
	// DialOptions.QUICFallbackAfter.
	ModeAuto Mode = "auto"
	ModeQUIC Mode = "quic"
	ModeTCP  Mode = "tcp"
)

// ParseMode accepts "auto", "quic" and "tcp" (the agent's --transport flag).
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeAuto, ModeQUIC, ModeTCP:
		return m, nil
	case "":
		return ModeAuto, nil
	}
	return "", fmt.Errorf("fabricnet: transport %q is not auto, quic or tcp", s)
}

// DialOptions tune Dial; nil means defaults.
type DialOptions struct {
	// QUICFallbackAfter is how long ModeAuto waits for a QUIC handshake before trying
	// TCP (default 1.5s).
	QUICFallbackAfter time.Duration
	// QUIC and Yamux override the transport settings (nil: this package's defaults).
	QUIC  *quic.Config
	Yamux *yamux.Config
	// DialTCP, when set, opens the TCP connection of a TLS+yamux tunnel or a bulk
	// connection instead of a net.Dialer (a proxy, a socket option; tests make it fail to play a network path
	// that blocks TCP).
	DialTCP func(ctx context.Context, addr string) (net.Conn, error)
}

// Dial opens a tunnel to addr ("host:port"). tlsConf must trust the fabric CA (and set
// ServerName when addr's host is not the name on the certificate); ALPN and TLS 1.3 are
// set here. The returned Session is not yet authenticated: call Authenticate next.
func Dial(ctx context.Context, addr string, mode Mode, tlsConf *tls.Config, opts *DialOptions) (Session, error) {
	var o DialOptions
	if opts != nil {
		o = *opts
	}
	if o.QUICFallbackAfter <= 0 {
		o.QUICFallbackAfter = 1500 * time.Millisecond
	}
	tc := clientTLS(tlsConf, addr)
	switch mode {
	case ModeQUIC:
		return dialQUIC(ctx, addr, tc, o.QUIC)
	case ModeTCP:
		return dialTCP(ctx, addr, tc, &o)
	case ModeAuto, "":
		qctx, cancel := context.WithTimeout(ctx, o.QUICFallbackAfter)
		s, qerr := dialQUIC(qctx, addr, tc, o.QUIC)
		cancel()
		if qerr == nil {
			return s, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if ServerBusy(qerr) {
			// UDP reaches the control plane; it is shedding load. Falling back to TCP
			// would only take the attempt around the bound (Listener's
			// MaxConcurrentQUICHandshakes) and leave the agent on the slower transport.
			return nil, qerr
		}
		s, terr := dialTCP(ctx, addr, tc, &o)
		if terr != nil {
			return nil, errors.Join(fmt.Errorf("quic: %w", qerr), fmt.Errorf("tcp: %w", terr))
		}
		return s, nil
	}
	return nil, fmt.Errorf("fabricnet: unknown mode %q", mode)
}

func dialQUIC(ctx context.Context, addr string, tc *tls.Config, qc *quic.Config) (Session, error) {
	ra, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, err
	}
	udp, err := net.ListenUDP("udp", nil)
	if err != nil {
		return nil, err
	}
	tr := &quic.Transport{Conn: udp}
	c, err := tr.Dial(ctx, ra, tc, quicConfig(qc))
	if err != nil {
		_ = tr.Close()
		_ = udp.Close()
		return nil, err
	}
	return newQUICSession(c, tr), nil
}

// clientTLS is tlsConf with the fabric's ALPN and TLS 1.3, and the server name taken
// from addr's host when tlsConf names none.
func clientTLS(tlsConf *tls.Config, addr string) *tls.Config {
	tc := withALPN(tlsConf)
	if tc.ServerName == "" {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			tc.ServerName = host
		}
	}
	return tc
}

// tcpConn opens the TCP connection under a TLS+TCP tunnel or a bulk connection
// (o.DialTCP when set), with Nagle off: frames and records are written whole.
func tcpConn(ctx context.Context, addr string, o *DialOptions) (net.Conn, error) {
	var c net.Conn
	var err error
	if o.DialTCP != nil {
		c, err = o.DialTCP(ctx, addr)
	} else {
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, err
	}
	if t, ok := c.(*net.TCPConn); ok {
		_ = t.SetNoDelay(true)
	}
	return c, nil
}

func dialTCP(ctx context.Context, addr string, tc *tls.Config, o *DialOptions) (Session, error) {
	c, err := tcpConn(ctx, addr, o)
	if err != nil {
		return nil, err
	}
	fc := newFrameConn(c, tc, false)
	if err := fc.HandshakeContext(ctx); err != nil {
		_ = c.Close()
		return nil, err
	}
	mux, err := yamux.Client(fc, yamuxConfig(o.Yamux))
	if err != nil {
		_ = fc.Close()
		return nil, err
	}
	return &yamuxSession{mux: mux, tls: fc.Conn}, nil
}
