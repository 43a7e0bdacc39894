package apps

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// dialTimeout bounds the connect to the app's port.
const dialTimeout = 5 * time.Second

// ServeStream connects an APP_PROXY stream to the instance's port; it closes st.
func (s *Supervisor) ServeStream(ctx context.Context, pre *fabricv1.StreamPreamble, st net.Conn) {
	if pre.GetKind() != fabricv1.StreamKind_STREAM_KIND_APP_PROXY {
		refuse(st, "unsupported_kind", "not an app proxy stream")
		return
	}
	id := pre.GetAppInstanceId()
	port, allocationID, state, ok := s.target(id)
	switch {
	case !ok || (pre.GetAllocationId() != "" && pre.GetAllocationId() != allocationID):
		refuse(st, apptask.StreamTargetNotFound, "this node runs no such app instance")
		return
	case !apptask.Live(state):
		refuse(st, apptask.StreamAppNotRunning, "the app instance is "+state)
		return
	case pre.GetTargetPort() != 0 && int(pre.GetTargetPort()) != port:
		refuse(st, apptask.StreamTargetNotFound, fmt.Sprintf("the app instance serves port %d, not %d", port, pre.GetTargetPort()))
		return
	}
	if _, live := s.o.Envs.Session(allocationID); !live {
		refuse(st, apptask.StreamAppNotRunning, "the app instance's allocation is not active")
		return
	}
	d := net.Dialer{Timeout: dialTimeout}
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		s.o.Logger.Info("app proxy: connect failed", "app_instance_id", id, "port", port, "state", state, "err", err)
		refuse(st, apptask.StreamConnectFailed, "the app does not accept connections on its port")
		return
	}
	if err := fabricnet.WriteReply(st, &fabricv1.StreamReply{Ok: true}); err != nil {
		_ = c.Close()
		_ = st.Close()
		return
	}
	stop := context.AfterFunc(ctx, func() { _ = c.Close(); _ = st.Close() })
	defer stop()
	pipe(st, c)
}

func refuse(st net.Conn, code, msg string) {
	_ = st.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_ = fabricnet.WriteReply(st, &fabricv1.StreamReply{Ok: false, ErrorCode: code, Message: msg})
	_ = st.Close()
}

// pipe copies both ways; the end of one direction is passed on as a half close where
// the connection has one, and both are closed when both directions end.
func pipe(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		if tc, ok := src.(*net.TCPConn); ok {
			// From the app: through buffers held only while bytes wait (copy.go).
			_ = copyFromApp(dst, tc)
		} else {
			// Toward the app (requests, uploads): io.Copy, whose TCP side's ReadFrom
			// copies through one 32 KiB buffer.
			_, _ = io.Copy(dst, src)
		}
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			_ = dst.Close()
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
	_ = a.Close()
	_ = b.Close()
}

// Streams routes the agent's raw streams: APP_PROXY to the supervisor, every other
// kind to Other.
type Streams struct {
	Apps  *Supervisor
	Other interface {
		ServeStream(ctx context.Context, pre *fabricv1.StreamPreamble, st net.Conn)
	}
}

// ServeStream implements the agent's StreamHandler.
func (m Streams) ServeStream(ctx context.Context, pre *fabricv1.StreamPreamble, st net.Conn) {
	if pre.GetKind() == fabricv1.StreamKind_STREAM_KIND_APP_PROXY && m.Apps != nil {
		m.Apps.ServeStream(ctx, pre, st)
		return
	}
	if m.Other == nil {
		refuse(st, "unsupported_kind", fmt.Sprintf("this agent does not serve %s streams", pre.GetKind()))
		return
	}
	m.Other.ServeStream(ctx, pre, st)
}
