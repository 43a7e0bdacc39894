package fabric

import (
	"context"

	"github.com/google/uuid"
	"google.golang.org/grpc"
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
