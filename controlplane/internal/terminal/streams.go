package terminal

import (
	"context"
	"errors"
	"net"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/fabric"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// OpenStream opens a raw stream to a node's agent for another byte-stream feature (the
// app proxy, docs/app-proxy.md), through the replica holding the node's tunnel when it
// is not this one: the one stream-opening and relay mechanism (ARCHITECTURE §5a). octx
// bounds the opening; a relayed stream lives until bctx ends or it is closed. The
// errors are the fabric's as they are (fabric.ErrNodeOffline,
// *fabricnet.StreamRefusedError, a context error) for a local open, and envelopes
// (replica_unreachable, the holder's answer) for a relayed one; the caller maps them.
// Only relayable kinds may be relayed.
func (s *Service) OpenStream(octx, bctx context.Context, nodeID uuid.UUID, pre *fabricv1.StreamPreamble) (net.Conn, error) {
	st, err := s.deps.Fabric.OpenStream(octx, nodeID, pre)
	var elsewhere *fabric.NotHeldHereError
	if errors.As(err, &elsewhere) {
		return s.dialRelay(octx, bctx, elsewhere.Replica, nodeID, pre)
	}
	return st, err
}
