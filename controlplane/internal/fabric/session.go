package fabric

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// endKind says why a session ended, which decides what presence and the node's
// status learn about it.
type endKind int

const (
	// endLost: the tunnel broke. Presence keeps the node online until its TTL runs out,
	// so a reconnect within the TTL is no status change.
	endLost endKind = iota
	// endReplaced: a newer tunnel from the same node took over; nothing changes.
	endReplaced
	// endShutdown: this replica is stopping; presence stays for the replica the agent
	// reconnects to.
	endShutdown
	// endExpired: no heartbeat within the TTL: the node is offline now.
	endExpired
	// endDisconnected: Disconnect (token revoked, node deleted): offline now.
	endDisconnected
)

// session is one node's live tunnel on this replica.
type session struct {
	id          uuid.UUID
	nodeID      uuid.UUID
	fs          fabricnet.Session
	srv         *Server
	connectedAt time.Time
	done        chan struct{}

	mu            sync.Mutex
	closed        bool
	lastHeartbeat time.Time
	hb            heartbeat
	hello         bool // a Hello arrived: the node is online through this session
	inventory     *fabricv1.Inventory
	agentVersion  string
	hostname      string
	ctl           *controlCall
	pending       map[string]chan *fabricv1.TaskAck
	kvRev         uint64            // revision of this session's presence entry
	kvHeartbeat   time.Time         // last heartbeat written to presence
	side          fabricnet.Session // the live bulk side session, if any (bulk.go)
	bulkConns     int               // bulk connections being served (bulk.go)
}

// controlCall is the current Control RPC of a session: where ControlMessages go.
type controlCall struct {
	out  chan *fabricv1.ControlMessage
	done chan struct{}
}

var errSessionGone = errors.New("fabric: session ended")

func (ss *session) touch(now time.Time) {
	ss.mu.Lock()
	if now.After(ss.lastHeartbeat) {
		ss.lastHeartbeat = now
	}
	ss.mu.Unlock()
}

// send queues m on the session's control stream.
func (ss *session) send(ctx context.Context, m *fabricv1.ControlMessage) error {
	ss.mu.Lock()
	call := ss.ctl
	ss.mu.Unlock()
	if call == nil {
		return errSessionGone
	}
	select {
	case call.out <- m:
		return nil
	case <-call.done:
		return errSessionGone
	case <-ss.done:
		return errSessionGone
	case <-ctx.Done():
		return ctx.Err()
	}
}

// close ends the session once; kind decides what presence and the node's status learn.
func (ss *session) close(kind endKind, reason string) {
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		return
	}
	ss.closed = true
	hello := ss.hello
	for id, ch := range ss.pending {
		close(ch)
		delete(ss.pending, id)
	}
	ss.mu.Unlock()
	close(ss.done)
	_ = ss.fs.Close(reason)
	s := ss.srv
	s.unregister(ss)
	defer s.ending.Done()
	if !hello {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	switch kind {
	case endLost:
		// Record the last heartbeat precisely so the reaper's TTL starts from it.
		s.writeSessionPresence(ctx, ss, true)
	case endExpired, endDisconnected:
		s.markOffline(ctx, ss.nodeID, ss.id)
	}
	s.deps.Log.Info("fabric: tunnel ended", "node_id", ss.nodeID, "session_id", ss.id, "reason", reason)
}

// setInventory records inv and reports whether it differs from the previous one.
func (ss *session) setInventory(inv *fabricv1.Inventory) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.inventory != nil && proto.Equal(ss.inventory, inv) {
		return false
	}
	ss.inventory = inv
	return true
}
