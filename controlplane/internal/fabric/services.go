package fabric

import (
	"context"
	"net"

	"github.com/google/uuid"
	"google.golang.org/grpc"

	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// RegisterService adds a gRPC service to the ones agents reach on the streams they open
// (beside Fabric), for features that serve nodes over the tunnel (storage attachments).
// It must be called before Run: gRPC refuses registrations once serving.
func (s *Server) RegisterService(desc *grpc.ServiceDesc, impl any) {
	s.grpc.RegisterService(desc, impl)
}

// NodeID is the node whose authenticated tunnel carries the gRPC call of ctx: a service
// registered through RegisterService decides what the caller may do from it, never from
// anything the request says.
func NodeID(ctx context.Context) (uuid.UUID, bool) {
	ss, ok := sessionOf(ctx)
	if !ok || ss == nil {
		return uuid.Nil, false
	}
	return ss.nodeID, true
}

// RawStreamHandler serves one agent-opened raw stream (fabricnet.OpenAgentStream): it
// reads the request frame, answers with a StreamReply and owns the stream until it
// returns (the stream is closed after). ctx ends with the tunnel; NodeID(ctx) is the
// stream's node, as for a gRPC call.
type RawStreamHandler func(ctx context.Context, st net.Conn)

// HandleRawStream serves agent-opened raw streams of kind with h, for bulk transfers
// that gRPC's framing and copies make costly (StorageFabric reads). It must be called
// before Run.
func (s *Server) HandleRawStream(kind fabricnet.AgentStreamKind, h RawStreamHandler) {
	if s.raw == nil {
		s.raw = map[fabricnet.AgentStreamKind]RawStreamHandler{}
	}
	s.raw[kind] = h
}
