package agent

import (
	"context"
	"net"
	"time"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// preambleTimeout bounds how long a control-plane-opened stream may take to say what
// it is.
const preambleTimeout = 10 * time.Second

// acceptStreams serves the raw streams the control plane opens until the tunnel ends.
func (a *Agent) acceptStreams(ctx context.Context, sess fabricnet.Session) {
	for {
		st, err := sess.AcceptStream(ctx)
		if err != nil {
			return
		}
		go a.serveStream(ctx, st)
	}
}

func (a *Agent) serveStream(ctx context.Context, st net.Conn) {
	_ = st.SetReadDeadline(time.Now().Add(preambleTimeout))
	pre, err := fabricnet.ReadPreamble(st)
	if err != nil {
		_ = st.Close()
		return
	}
	_ = st.SetReadDeadline(time.Time{})
	if pre.GetKind() == fabricv1.StreamKind_STREAM_KIND_METRICS {
		a.serveMetrics(ctx, st)
		return
	}
	if a.o.Streams == nil {
		_ = fabricnet.WriteReply(st, &fabricv1.StreamReply{Ok: false, ErrorCode: "unsupported_kind", Message: "this agent serves no raw streams yet"})
		_ = st.Close()
		return
	}
	a.o.Streams.ServeStream(ctx, pre, st)
}
