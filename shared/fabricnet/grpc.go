package fabricnet

import (
	"context"
	"net"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
)

// GRPCClient returns a gRPC client connection whose transports are streams the agent
// opens on s (the tunnel is already TLS: the gRPC layer adds none). Close it when s ends;
// it cannot outlive the tunnel. opts come after this package's and override them.
//
// On QUIC the client pings (HTTP/2 PING) every grpcKeepAlive when it has heard nothing.
// That is how an idle agent learns of a control plane that crashed and came back: the
// restarted listener answers a packet of a tunnel it does not know with a stateless
// reset (ListenOptions.StatelessResetKey), but quic-go answers only packets longer than
// the smallest reset it sends (42 bytes), and QUIC's own keep-alive PING packets are
// about 25. A PING in a stream frame is over that, so the agent hears the reset within
// grpcKeepAlive of the restart instead of at its idle timeout, however long its
// heartbeat interval (fleet-scaled: 200 s at 10,000 nodes). On TLS+yamux the kernel
// of a crashed control plane closes the connections itself: no ping is needed there.
func GRPCClient(s Session, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	all := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return s.OpenStream(ctx)
		}),
	}
	if s.Transport() == TransportQUIC {
		// The timeout is the tunnel's own idle timeout: the ping adds no new way for a
		// slow but live control plane to lose its agents.
		//
		// Fixed flow-control windows switch gRPC's bandwidth estimator off, and with it
		// its BDP pings. The server counts a ping within 5 s of the previous one as a
		// strike (its keep-alive enforcement), forgiven only by data it sends after; a BDP
		// ping (sent on data from the server) landing just after a keep-alive ping that
		// used up the forgiveness is a strike, strikes add up over a tunnel's life, and
		// the third ends the agent's gRPC connection (GOAWAY too_many_pings: 2 agents of
		// 10,000 in the bench's QUIC run). Keep-alive pings alone are at least 15 s apart
		// as the server reads them (the next one goes 15 s after the last one's ack).
		// The Control stream carries small messages: 1 MiB windows lose nothing.
		all = append(all, grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time: grpcKeepAlive, Timeout: idleTimeout, PermitWithoutStream: true,
		}), grpc.WithInitialWindowSize(1<<20), grpc.WithInitialConnWindowSize(1<<20))
	}
	return grpc.NewClient("passthrough:///gantry-fabric", append(all, opts...)...)
}

// StreamListener is a net.Listener fed with streams by hand (Push), so one grpc.Server
// can serve the agent-opened streams of many tunnels.
type StreamListener struct {
	addr  net.Addr
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

// NewStreamListener returns a listener reporting addr as its address.
func NewStreamListener(addr net.Addr) *StreamListener {
	return &StreamListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

// Push hands c to Accept; it blocks until accepted, ctx ends or the listener closes
// (then c is closed and false returned).
func (l *StreamListener) Push(ctx context.Context, c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
	case <-ctx.Done():
	}
	_ = c.Close()
	return false
}

func (l *StreamListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *StreamListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *StreamListener) Addr() net.Addr { return l.addr }
