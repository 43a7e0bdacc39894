package fabricnet

import (
	"context"
	"net"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// GRPCClient returns a gRPC client connection whose transports are streams the agent
// opens on s (the tunnel is already TLS: the gRPC layer adds none). Close it when s ends;
// it cannot outlive the tunnel.
func GRPCClient(s Session, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	all := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return s.OpenStream(ctx)
		}),
	}, opts...)
	return grpc.NewClient("passthrough:///gantry-fabric", all...)
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
