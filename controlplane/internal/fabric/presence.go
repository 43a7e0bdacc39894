package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	"github.com/gantry-gpu/gantry/controlplane/internal/loop"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// Presence lives in the KV bucket under two kinds of key:
//
//	node.<node uuid>  -> presenceEntry: which replica and session hold the node's tunnel,
//	                     online or not, last heartbeat (refreshed at most every
//	                     PresenceRefresh), TTL.
//	replica.<id>      -> replicaEntry: a replica announcing it is alive.
//
// Every replica mirrors the bucket in memory through a watcher. Writes to a node's entry
// after the first are compare-and-set on the revision the writer last saw, so a replica
// whose session was replaced (elsewhere) cannot overwrite the newer holder's entry.

type presenceEntry struct {
	NodeID        uuid.UUID `json:"node_id"`
	Replica       string    `json:"replica"`
	SessionID     uuid.UUID `json:"session_id"`
	Transport     string    `json:"transport"`
	Online        bool      `json:"online"`
	LastHeartbeat time.Time `json:"last_heartbeat"`
	TTLMillis     int64     `json:"ttl_ms"`
	ConnectedAt   time.Time `json:"connected_at"`
}

func (e presenceEntry) deadline() time.Time {
	return e.LastHeartbeat.Add(time.Duration(e.TTLMillis) * time.Millisecond)
}

type replicaEntry struct {
	Replica   string    `json:"replica"`
	StartedAt time.Time `json:"started_at"`
}

func nodeKey(id uuid.UUID) string { return "node." + id.String() }
func replicaKey(id string) string { return "replica." + id }
func nodeFromKey(k string) (uuid.UUID, bool) {
	s, ok := strings.CutPrefix(k, "node.")
	if !ok {
		return uuid.Nil, false
	}
	id, err := uuid.Parse(s)
	return id, err == nil
}

type mirroredEntry struct {
	presenceEntry
	rev uint64
}

// presenceMirror is this replica's in-memory copy of the bucket.
type presenceMirror struct {
	mu       sync.Mutex
	nodes    map[uuid.UUID]mirroredEntry
	replicas map[string]time.Time // replica -> when we last saw it announce (our clock)
	// online counts the entries of nodes that are Online, kept with every change: every
	// new tunnel asks for it (heartbeat TTLs scale with the fleet), and counting the map
	// each time made a reconnect of n agents cost O(n²).
	online   int
	ready    chan struct{}
	readyOne sync.Once
}

func newPresenceMirror() *presenceMirror {
	return &presenceMirror{nodes: map[uuid.UUID]mirroredEntry{}, replicas: map[string]time.Time{}, ready: make(chan struct{})}
}

// apply records an entry unless the mirror already holds a newer revision.
func (m *presenceMirror) apply(e presenceEntry, rev uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur, ok := m.nodes[e.NodeID]
	if ok && cur.rev >= rev {
		return
	}
	if ok && cur.Online {
		m.online--
	}
	if e.Online {
		m.online++
	}
	m.nodes[e.NodeID] = mirroredEntry{e, rev}
}

func (m *presenceMirror) remove(id uuid.UUID, rev uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur, ok := m.nodes[id]; ok && cur.rev < rev {
		if cur.Online {
			m.online--
		}
		delete(m.nodes, id)
	}
}

func (m *presenceMirror) get(id uuid.UUID) (mirroredEntry, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.nodes[id]
	return e, ok
}

func (m *presenceMirror) all() []mirroredEntry {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]mirroredEntry, 0, len(m.nodes))
	for _, e := range m.nodes {
		out = append(out, e)
	}
	return out
}

func (m *presenceMirror) onlineCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.online
}

func (m *presenceMirror) replicaSeen(id string) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.replicas[id]
	return t, ok
}

// startPresence announces this replica and loads the mirror before tunnels are served.
func (s *Server) startPresence(ctx context.Context) error {
	if err := s.announce(ctx); err != nil {
		return err
	}
	return nil
}

func (s *Server) announce(ctx context.Context) error {
	b, _ := json.Marshal(replicaEntry{Replica: s.cfg.ReplicaID, StartedAt: s.startedAt})
	_, err := s.kv.Put(ctx, replicaKey(s.cfg.ReplicaID), b)
	return err
}

func (s *Server) announceReplica(ctx context.Context) {
	loop.Every(ctx, s.cfg.ReplicaRefresh, s.deps.Log, "fabric: replica announcement", s.announce)
}

// WaitPresence blocks until the mirror holds the bucket's current contents (Run
// started the watcher), or ctx ends.
func (s *Server) WaitPresence(ctx context.Context) error {
	select {
	case <-s.presence.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// watchPresence keeps the mirror current, and ends a local session whose node another
// replica has taken over (the agent reconnected elsewhere).
func (s *Server) watchPresence(ctx context.Context) {
	for ctx.Err() == nil {
		w, err := s.kv.WatchAll(ctx)
		if err != nil {
			s.deps.Log.Warn("fabric: presence watch failed", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
				continue
			}
		}
		for u := range w.Updates() {
			if u == nil {
				s.presence.readyOne.Do(func() { close(s.presence.ready) })
				continue
			}
			s.applyUpdate(u)
		}
		_ = w.Stop()
	}
}

func (s *Server) applyUpdate(u jetstream.KeyValueEntry) {
	key := u.Key()
	if r, ok := strings.CutPrefix(key, "replica."); ok {
		s.presence.mu.Lock()
		if u.Operation() == jetstream.KeyValuePut {
			s.presence.replicas[r] = s.deps.Clock.Now()
		} else {
			delete(s.presence.replicas, r)
		}
		s.presence.mu.Unlock()
		return
	}
	id, ok := nodeFromKey(key)
	if !ok {
		return
	}
	if u.Operation() != jetstream.KeyValuePut {
		s.presence.remove(id, u.Revision())
		return
	}
	var e presenceEntry
	if json.Unmarshal(u.Value(), &e) != nil {
		return
	}
	s.presence.apply(e, u.Revision())
	// Taken over elsewhere: a newer entry for a node we hold, written by another replica.
	if ss := s.local(id); ss != nil && e.Replica != s.cfg.ReplicaID && e.SessionID != ss.id {
		ss.mu.Lock()
		newer := ss.kvRev != 0 && u.Revision() > ss.kvRev
		ss.mu.Unlock()
		if newer {
			go ss.close(endReplaced, "replaced by a newer tunnel on replica "+e.Replica)
		}
	}
}

// writeSessionPresence writes ss's entry: unconditionally for the first write (the
// newest tunnel wins), compare-and-set after that.
func (s *Server) writeSessionPresence(ctx context.Context, ss *session, online bool) {
	ss.mu.Lock()
	e := presenceEntry{
		NodeID: ss.nodeID, Replica: s.cfg.ReplicaID, SessionID: ss.id, Transport: string(ss.fs.Transport()),
		Online: online, LastHeartbeat: ss.lastHeartbeat, TTLMillis: ss.hb.ttl.Milliseconds(), ConnectedAt: ss.connectedAt,
	}
	rev := ss.kvRev
	ss.mu.Unlock()
	b, _ := json.Marshal(e)
	var newRev uint64
	var err error
	if rev == 0 {
		newRev, err = s.kv.Put(ctx, nodeKey(ss.nodeID), b)
	} else {
		newRev, err = s.kv.Update(ctx, nodeKey(ss.nodeID), b, rev)
	}
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			s.deps.Log.Warn("fabric: presence write failed", "node_id", ss.nodeID, "err", err)
		}
		return
	}
	s.presence.apply(e, newRev)
	ss.mu.Lock()
	ss.kvRev, ss.kvHeartbeat = newRev, e.LastHeartbeat
	ss.mu.Unlock()
}

// markOffline marks the node offline in presence (if the entry is still the one of
// session sessionID, or any entry when sessionID is Nil) and tells the directory. The
// compare-and-set makes exactly one replica do it.
func (s *Server) markOffline(ctx context.Context, nodeID, sessionID uuid.UUID) bool {
	ent, err := s.kv.Get(ctx, nodeKey(nodeID))
	if err != nil {
		return false
	}
	var e presenceEntry
	if json.Unmarshal(ent.Value(), &e) != nil || !e.Online {
		return false
	}
	if sessionID != uuid.Nil && e.SessionID != sessionID {
		return false
	}
	return s.reap(ctx, e, ent.Revision())
}

// reap flips an online entry to offline with compare-and-set on rev; the winner tells
// the directory. If the node came back meanwhile, it says so again.
func (s *Server) reap(ctx context.Context, e presenceEntry, rev uint64) bool {
	e.Online = false
	b, _ := json.Marshal(e)
	newRev, err := s.kv.Update(ctx, nodeKey(e.NodeID), b, rev)
	if err != nil {
		return false
	}
	s.presence.apply(e, newRev)
	now := s.deps.Clock.Now()
	if err := s.deps.Directory.NodeStatus(ctx, e.NodeID, false, now); err != nil {
		s.deps.Log.Warn("fabric: offline status not recorded", "node_id", e.NodeID, "err", err)
	}
	s.deps.Log.Info("fabric: node offline", "node_id", e.NodeID, "last_heartbeat", e.LastHeartbeat)
	// A tunnel that arrived between our read and the directory call must not stay
	// recorded offline.
	if cur, err := s.kv.Get(ctx, nodeKey(e.NodeID)); err == nil && cur.Revision() > newRev {
		var c presenceEntry
		if json.Unmarshal(cur.Value(), &c) == nil && c.Online {
			_ = s.deps.Directory.NodeStatus(ctx, e.NodeID, true, now)
		}
	}
	return true
}

// replicaAlive: this replica, or one whose announcement we saw within 3 refreshes.
func (s *Server) replicaAlive(id string) bool {
	if id == s.cfg.ReplicaID {
		return true
	}
	seen, ok := s.presence.replicaSeen(id)
	return ok && s.deps.Clock.Now().Sub(seen) < 3*s.cfg.ReplicaRefresh
}

// Presence answers where a node's tunnel is (fleet.PresenceReader). A node this replica
// holds has its exact last heartbeat; others' are at most PresenceRefresh stale.
func (s *Server) Presence(_ context.Context, nodeID uuid.UUID) (fleet.Presence, bool, error) {
	e, ok := s.presence.get(nodeID)
	if !ok {
		return fleet.Presence{}, false, nil
	}
	return s.toFleet(e.presenceEntry), true, nil
}

// AllPresence is every node presence knows of (fleet.PresenceReader).
func (s *Server) AllPresence(context.Context) (map[uuid.UUID]fleet.Presence, error) {
	out := map[uuid.UUID]fleet.Presence{}
	for _, e := range s.presence.all() {
		out[e.NodeID] = s.toFleet(e.presenceEntry)
	}
	return out, nil
}

func (s *Server) toFleet(e presenceEntry) fleet.Presence {
	p := fleet.Presence{NodeID: e.NodeID, Replica: e.Replica, Online: e.Online, LastHeartbeat: e.LastHeartbeat, Transport: e.Transport}
	if ss := s.local(e.NodeID); ss != nil && ss.id == e.SessionID {
		ss.mu.Lock()
		p.LastHeartbeat = ss.lastHeartbeat
		ss.mu.Unlock()
	}
	return p
}

// sweepLoop checks TTLs, refreshes presence, ends the startup window and reaps nodes
// nobody holds any more.
func (s *Server) sweepLoop(ctx context.Context) {
	loop.Every(ctx, s.cfg.SweepInterval, s.deps.Log, "fabric: presence sweep", func(ctx context.Context) error {
		s.sweep(ctx) // its presence writes log their own failures, node by node
		return nil
	})
}

func (s *Server) sweep(ctx context.Context) {
	now := s.deps.Clock.Now()
	s.mu.Lock()
	local := make([]*session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		local = append(local, ss)
	}
	s.mu.Unlock()

	endStartup := false
	if !s.startupOver && !s.inStartup() {
		s.startupOver, endStartup = true, true
	}
	for _, ss := range local {
		ss.mu.Lock()
		hello, last, ttl, written := ss.hello, ss.lastHeartbeat, ss.hb.ttl, ss.kvHeartbeat
		ss.mu.Unlock()
		if !hello {
			continue
		}
		switch {
		case now.Sub(last) > ttl:
			go ss.close(endExpired, "no heartbeat within the TTL")
			continue
		case last.Sub(written) >= s.cfg.PresenceRefresh:
			s.writeSessionPresence(ctx, ss, true)
		}
		if endStartup {
			// The startup window's long TTL ends: hand out the fleet-sized one.
			hb := s.heartbeatConfig()
			ss.mu.Lock()
			ss.hb = hb
			ss.mu.Unlock()
			_ = ss.send(ctx, &fabricv1.ControlMessage{Msg: &fabricv1.ControlMessage_HeartbeatConfig{HeartbeatConfig: hb.proto()}})
		}
	}

	for _, e := range s.presence.all() {
		if !e.Online {
			continue
		}
		if e.Replica == s.cfg.ReplicaID {
			if ss := s.local(e.NodeID); ss != nil && ss.id == e.SessionID {
				continue // live here; the TTL check above covers it
			}
		} else if s.replicaAlive(e.Replica) {
			continue // its holder decides
		}
		deadline := e.deadline()
		if e.LastHeartbeat.Before(s.startedAt) {
			// Held before this replica started: give it the startup TTL to come back.
			deadline = maxTime(deadline, s.startedAt.Add(s.cfg.StartupTTL))
		}
		if now.After(deadline) {
			s.reap(ctx, e.presenceEntry, e.rev)
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
