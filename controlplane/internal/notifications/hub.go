package notifications

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/shared/clock"
)

// ProjectAccess says whether a user can see a project (tenancy's Access): an error
// coded insufficient_permissions means no; any other error means "cannot tell now".
type ProjectAccess interface {
	Access(ctx context.Context, p *principal.Principal, projectID uuid.UUID) (projectctx.Project, error)
}

// Deps is what a Hub needs.
type Deps struct {
	// Config nil reads GANTRY_NOTIFICATIONS_* from the environment.
	Config *Config
	NATS   *nats.Conn
	// EventsPrefix is where the outbox relay publishes domain events ("gantry.events.").
	EventsPrefix string
	// SubjectPrefix is where notifications travel between replicas
	// ("gantry.notifications."); it must not lie under EventsPrefix, or the events
	// stream would store them.
	SubjectPrefix string
	Projects      ProjectAccess
	Registry      prometheus.Registerer
	Clock         clock.Clock
	Log           *slog.Logger
}

// inboxSize bounds the NATS messages waiting for the dispatcher. Beyond it NATS drops
// (a slow consumer): best effort, like the rest.
const inboxSize = 8192

// recentEvents is how many event ids the hub remembers to drop a relay's re-publish
// (the stream dedupes on Nats-Msg-Id; plain subscribers see both copies).
const recentEvents = 4096

// Hub holds this replica's notification connections and feeds them from NATS.
type Hub struct {
	cfg          Config
	clock        clock.Clock
	log          *slog.Logger
	metrics      *Metrics
	projects     ProjectAccess
	eventsPrefix string
	prefix       string
	publisher    *Publisher

	in         chan *nats.Msg
	subs       []*nats.Subscription
	quit       chan struct{}
	dispatched chan struct{}
	conns      sync.WaitGroup
	seen       recent // dispatcher goroutine only

	mu       sync.RWMutex
	closed   bool
	channels map[Channel]map[*subscriber]struct{}
	perUser  map[uuid.UUID]int
}

// New subscribes to the events and notification subjects and starts delivering.
func New(d Deps) (*Hub, error) {
	var (
		cfg Config
		err error
	)
	if d.Config != nil {
		cfg, err = d.Config.withDefaults()
	} else {
		cfg, err = LoadConfig()
	}
	if err != nil {
		return nil, err
	}
	if d.NATS == nil || d.Projects == nil || d.Registry == nil {
		return nil, errors.New("notifications: NATS, Projects and Registry are required")
	}
	if !strings.HasSuffix(d.EventsPrefix, ".") || !strings.HasSuffix(d.SubjectPrefix, ".") ||
		strings.HasPrefix(d.SubjectPrefix, d.EventsPrefix) || strings.HasPrefix(d.EventsPrefix, d.SubjectPrefix) {
		return nil, fmt.Errorf("notifications: subject prefixes %q and %q must end in a dot and not nest", d.EventsPrefix, d.SubjectPrefix)
	}
	if d.Clock == nil {
		d.Clock = clock.Real{}
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	m, err := NewMetrics(d.Registry)
	if err != nil {
		return nil, err
	}
	h := &Hub{
		cfg: cfg, clock: d.Clock, log: d.Log, metrics: m, projects: d.Projects,
		eventsPrefix: d.EventsPrefix, prefix: d.SubjectPrefix,
		publisher: &Publisher{NATS: d.NATS, Prefix: d.SubjectPrefix, Clock: d.Clock},
		in:        make(chan *nats.Msg, inboxSize), quit: make(chan struct{}), dispatched: make(chan struct{}),
		seen:     newRecent(recentEvents),
		channels: map[Channel]map[*subscriber]struct{}{}, perUser: map[uuid.UUID]int{},
	}
	// One channel for every subscription, drained by one goroutine: messages published
	// by one connection (an event, then a broadcast) reach clients in that order.
	subjects := []string{d.SubjectPrefix + ">"}
	for _, s := range eventSubjects {
		subjects = append(subjects, d.EventsPrefix+s)
	}
	for _, s := range subjects {
		sub, err := d.NATS.ChanSubscribe(s, h.in)
		if err != nil {
			h.unsubscribe()
			return nil, fmt.Errorf("notifications: subscribe %s: %w", s, err)
		}
		h.subs = append(h.subs, sub)
	}
	// The subscriptions are live on the server before New returns: a message published
	// right after reaches this replica.
	if err := d.NATS.FlushTimeout(5 * time.Second); err != nil {
		h.unsubscribe()
		return nil, fmt.Errorf("notifications: flush subscriptions: %w", err)
	}
	go h.dispatch()
	return h, nil
}

// Publish sends n to every replica (see Publisher.Publish).
func (h *Hub) Publish(ctx context.Context, n Notification) error { return h.publisher.Publish(ctx, n) }

// Broadcast sends a platform message to every connected user, on every replica.
func (h *Hub) Broadcast(ctx context.Context, typ string, data map[string]any) error {
	return h.publisher.Broadcast(ctx, typ, data)
}

// Publisher is the hub's publisher, for features that only publish.
func (h *Hub) Publisher() *Publisher { return h.publisher }

// Metrics are the hub's counters.
func (h *Hub) Metrics() *Metrics { return h.metrics }

func (h *Hub) unsubscribe() {
	for _, s := range h.subs {
		_ = s.Unsubscribe()
	}
}

func (h *Hub) dispatch() {
	defer close(h.dispatched)
	for {
		select {
		case <-h.quit:
			return
		case m := <-h.in:
			h.route(m)
		}
	}
}

// route turns one NATS message into a delivery, or drops it.
func (h *Hub) route(m *nats.Msg) {
	if c, ok := channelOfSubject(h.prefix, m.Subject); ok {
		var msg Message
		if len(m.Data) > maxDataBytes || json.Unmarshal(m.Data, &msg) != nil || msg.Channel != c {
			h.log.Warn("notifications: malformed message dropped", "subject", m.Subject)
			return
		}
		n := Notification{Channel: c, Type: msg.Type, Data: msg.Data}
		if raw := m.Header.Get(headerProject); raw != "" {
			id, err := uuid.Parse(raw)
			if err != nil {
				h.log.Warn("notifications: message with a malformed project dropped", "subject", m.Subject)
				return
			}
			n.Project = id
		}
		if n.validate() != nil {
			return
		}
		h.deliver(n, msg.SentAt)
		return
	}
	typ, ok := strings.CutPrefix(m.Subject, h.eventsPrefix)
	if !ok {
		return
	}
	if id := m.Header.Get(nats.MsgIdHdr); id != "" && !h.seen.add(id) {
		return
	}
	if n, ok := fromEvent(typ, m.Data); ok {
		h.deliver(n, h.clock.Now())
	}
}

// deliver queues n for every local connection subscribed to its channel. It never
// blocks: a connection whose queue is full is dropped (subscriber.offer).
func (h *Hub) deliver(n Notification, at time.Time) {
	body, err := n.encode(at)
	if err != nil {
		h.log.Warn("notifications: message dropped", "type", n.Type, "err", err)
		return
	}
	out := outgoing{body: body, project: n.Project}
	h.mu.RLock()
	defer h.mu.RUnlock()
	for s := range h.channels[n.Channel] {
		s.offer(out)
	}
}

var (
	errHubClosed   = errors.New("notifications: hub closed")
	errTooManyConn = errors.New("notifications: too many connections")
)

// attach registers a connection of p before the upgrade, so that everything published
// once the client holds its 101 reaches it (queued until start), and counts it against
// the per-user cap.
func (h *Hub) attach(p *principal.Principal, expires time.Time) (*subscriber, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, errHubClosed
	}
	if h.perUser[p.UserID] >= h.cfg.MaxConnectionsPerUser {
		return nil, errTooManyConn
	}
	h.perUser[p.UserID]++
	s := newSubscriber(h, p, expires)
	for _, c := range s.channels {
		set := h.channels[c]
		if set == nil {
			set = map[*subscriber]struct{}{}
			h.channels[c] = set
		}
		set[s] = struct{}{}
	}
	h.conns.Add(1)
	// Counted from here, so a client that holds its 101 is already in the gauge.
	h.metrics.Active.Inc()
	return s, nil
}

// start serves an attached subscriber over its upgraded connection until it ends.
func (h *Hub) start(s *subscriber, conn *websocket.Conn) {
	s.conn = conn
	go func() {
		defer h.conns.Done()
		s.run()
		h.detach(s)
	}()
}

// abandon forgets an attached subscriber whose upgrade failed.
func (h *Hub) abandon(s *subscriber) {
	s.stop(websocket.StatusInternalError, "upgrade failed")
	h.detach(s)
	h.conns.Done()
}

// detach forgets a connection and gives back its place under the per-user cap.
func (h *Hub) detach(s *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range s.channels {
		delete(h.channels[c], s)
		if len(h.channels[c]) == 0 {
			delete(h.channels, c)
		}
	}
	if h.perUser[s.who.UserID] <= 1 {
		delete(h.perUser, s.who.UserID)
	} else {
		h.perUser[s.who.UserID]--
	}
	h.metrics.Active.Dec()
}

// closeWait bounds how long Close waits for connections to finish their close handshake.
const closeWait = 10 * time.Second

// Close stops delivering, closes every connection with 1001 (going away) so clients
// reconnect to another replica, and unsubscribes.
func (h *Hub) Close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	var all []*subscriber
	for _, set := range h.channels {
		for s := range set {
			all = append(all, s)
		}
	}
	h.mu.Unlock()
	h.unsubscribe()
	close(h.quit)
	<-h.dispatched
	for _, s := range all {
		s.stop(websocket.StatusGoingAway, "server shutting down")
	}
	done := make(chan struct{})
	go func() { h.conns.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(closeWait):
		h.log.Warn("notifications: connections still closing at shutdown")
	}
}

// recent remembers the last n ids it was given.
type recent struct {
	ids  map[string]struct{}
	ring []string
	next int
}

func newRecent(n int) recent {
	return recent{ids: make(map[string]struct{}, n), ring: make([]string, n)}
}

// add records id and reports whether it is new.
func (r *recent) add(id string) bool {
	if _, dup := r.ids[id]; dup {
		return false
	}
	if old := r.ring[r.next]; old != "" {
		delete(r.ids, old)
	}
	r.ring[r.next] = id
	r.ids[id] = struct{}{}
	r.next = (r.next + 1) % len(r.ring)
	return true
}
