package fabricnet

import (
	"context"
	"crypto/tls"
	"errors"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// SideDialer opens a bulk side session beside an agent's tunnel (agent side): a second
// tunnel to the same control plane, over TLS+TCP, that carries only agent-opened raw
// streams and is served as streams of the main tunnel (AuthRequest.bulk_for_session_id
// in proto/fabric/v1). The agent hands one to the users of bulk streams when its tunnel
// is QUIC and the control plane offered side sessions (AuthResponse.bulk_side_sessions):
// quic-go costs about 2.4 times the CPU per byte of TLS+TCP (docs/fabric.md).
type SideDialer func(ctx context.Context) (Session, error)

// DialBulkSide dials addr over TLS+TCP and authenticates req, which must name the main
// session (BulkForSessionId). It returns the side session ready for OpenAgentStream, or
// the reason there is none (the session closed): a TCP path that is blocked, or a
// refusal (AuthErrSessionNotFound: the control plane holds no such live session of the
// node, for one when a load balancer sent the TCP connection to another replica).
func DialBulkSide(ctx context.Context, addr string, tlsConf *tls.Config, opts *DialOptions, req *fabricv1.AuthRequest) (Session, error) {
	if req.GetBulkForSessionId() == "" {
		return nil, errors.New("fabricnet: bulk side session without a main session id")
	}
	s, err := Dial(ctx, addr, ModeTCP, tlsConf, opts)
	if err != nil {
		return nil, err
	}
	if _, err := Authenticate(ctx, s, req); err != nil {
		_ = s.Close("side session refused")
		return nil, err
	}
	return s, nil
}
