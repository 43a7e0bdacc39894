package fabric

import (
	"context"
	"net"
	"time"

	"github.com/google/uuid"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// Bulk side sessions. quic-go spends about 2.4 times the CPU per byte that the TLS+TCP
// tunnel does (per-packet sealing, sending and acknowledging), which held an attachment
// read over a QUIC tunnel near 0.2x of an API GET (docs/storage.md). So an agent whose
// tunnel is QUIC may hold a second, TLS+TCP tunnel beside it for bulk bytes: it
// authenticates with the same node token and names the main session
// (AuthRequest.bulk_for_session_id). It is accepted only while this replica holds that
// live session of the token's node, and it is no session of its own: no presence, no
// Hello, no gRPC. Its agent-opened raw streams are served exactly as the main
// session's (routeStream, with the main session in the handler's context), so a raw
// stream handler's checks by node apply unchanged. It ends with the main session, and
// a main session has at most one: a newer one replaces it.

// serveSide serves fs, authenticated as nodeID on auth stream st, as the bulk side
// session of the node's session forID, or refuses it.
func (s *Server) serveSide(ctx context.Context, fs fabricnet.Session, nodeID uuid.UUID, st net.Conn, forID string) {
	ss := s.mainSession(nodeID, forID)
	if ss == nil || !ss.attachSide(fs) {
		s.deps.Log.Debug("fabric: bulk side session refused", "node_id", nodeID, "for_session", forID)
		refuseAuth(st, fabricnet.AuthErrSessionNotFound)
		_ = fs.Close("no such session")
		return
	}
	defer ss.detachSide(fs)
	werr := fabricnet.WriteFrame(st, &fabricv1.AuthResponse{Ok: true, NodeId: nodeID.String(), SessionId: ss.id.String()})
	_ = st.Close()
	if werr != nil {
		_ = fs.Close("auth response not delivered")
		return
	}
	go endWithMain(ss, fs)
	for {
		st, err := fs.AcceptStream(ctx)
		if err != nil {
			_ = fs.Close("side session ended")
			return
		}
		go s.routeStream(ctx, ss, st, true)
	}
}

// mainSession is the live session of nodeID on this replica whose id is forID (what a
// side session or a bulk connection names), or nil.
func (s *Server) mainSession(nodeID uuid.UUID, forID string) *session {
	id, err := uuid.Parse(forID)
	if err != nil {
		return nil
	}
	if ss := s.local(nodeID); ss != nil && ss.id == id {
		return ss
	}
	return nil
}

// endWithMain closes fs, a side session or bulk connection of ss, when ss ends; it
// returns when either has ended.
func endWithMain(ss *session, fs fabricnet.Session) {
	select {
	case <-ss.done:
		_ = fs.Close("main tunnel ended")
	case <-fs.Done():
	}
}

// attachSide makes fs the session's bulk side session, closing the one it replaces;
// false when the session has ended.
func (ss *session) attachSide(fs fabricnet.Session) bool {
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		return false
	}
	old := ss.side
	ss.side = fs
	ss.mu.Unlock()
	if old != nil {
		_ = old.Close("replaced by a newer side session")
	}
	return true
}

// detachSide forgets fs once it has ended, unless a newer one replaced it already.
func (ss *session) detachSide(fs fabricnet.Session) {
	ss.mu.Lock()
	if ss.side == fs {
		ss.side = nil
	}
	ss.mu.Unlock()
}

// BulkStreams is how many raw streams agents opened on bulk side sessions of this
// replica's sessions (tests, and the bench's proof of which path a read took).
func (s *Server) BulkStreams() int64 { return s.bulkStreams.Load() }

// Bulk connections (fabricnet.DialBulkConn): a TLS+TCP connection that carries one raw
// stream of a main session straight over TLS, with no yamux: the agent opens one per raw
// read stream, keeps it for range after range, and prefers them to a side session and
// to the tunnel on either transport (yamux's copies and goroutine handoffs were about a
// fifth of an attachment read's CPU, docs/storage.md). It authenticates with the node
// token and names the main session exactly as a side session does, and is accepted
// under the same condition; its stream is routed as a side session's (raw only, handler
// context carrying the main session) and it ends with the main session.

// maxBulkConns bounds the bulk connections one main session holds at once: an agent
// keeps PrefetchBlocks + 1 raw streams per tunnel idle and uses a few per open file, so
// this is far above a well-behaved agent's need and keeps a runaway one bounded.
const maxBulkConns = 256

// serveBulkConn serves fs, a bulk connection authenticated as nodeID on auth stream st,
// as one raw stream of the node's session forID, or refuses it.
func (s *Server) serveBulkConn(ctx context.Context, fs fabricnet.Session, nodeID uuid.UUID, st net.Conn, forID string) {
	ss := s.mainSession(nodeID, forID)
	if ss == nil || !ss.addBulkConn() {
		s.deps.Log.Debug("fabric: bulk connection refused", "node_id", nodeID, "for_session", forID)
		refuseAuth(st, fabricnet.AuthErrSessionNotFound)
		_ = fs.Close("no such session")
		return
	}
	defer ss.dropBulkConn()
	defer fs.Close("bulk connection done")
	werr := fabricnet.WriteFrame(st, &fabricv1.AuthResponse{Ok: true, NodeId: nodeID.String(), SessionId: ss.id.String()})
	_ = st.SetDeadline(time.Time{})
	if werr != nil {
		return
	}
	stop := context.AfterFunc(ctx, func() { _ = fs.Close("control plane stopping") })
	defer stop()
	go endWithMain(ss, fs)
	raw, err := fs.AcceptStream(ctx)
	if err != nil {
		return
	}
	s.routeStream(ctx, ss, raw, true)
}

// addBulkConn counts a new bulk connection of the session; false when the session has
// ended or holds maxBulkConns already.
func (ss *session) addBulkConn() bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed || ss.bulkConns >= maxBulkConns {
		return false
	}
	ss.bulkConns++
	return true
}

func (ss *session) dropBulkConn() {
	ss.mu.Lock()
	ss.bulkConns--
	ss.mu.Unlock()
}
