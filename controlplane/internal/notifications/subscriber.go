package notifications

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// outgoing is one encoded message on its way to a connection.
type outgoing struct {
	body []byte
	// project limits an organization message to those who can see the project.
	project uuid.UUID
	// pong answers a client's ping; it is not a notification and is not counted.
	pong bool
}

// verdict is a cached answer to "can this connection's user see that project".
type verdict struct {
	ok    bool
	until time.Time
}

// maxVerdicts bounds a connection's project-visibility cache.
const maxVerdicts = 1024

// subscriber is one WebSocket connection: three goroutines (write, read, ping) and a
// bounded queue between the hub's fan-out and the writer.
type subscriber struct {
	hub      *Hub
	conn     *websocket.Conn
	who      *principal.Principal
	expires  time.Time // the access token's expiry; zero: none known
	channels []Channel
	queue    chan outgoing

	ctx    context.Context
	cancel context.CancelFunc

	stopOnce sync.Once
	stopped  chan struct{}
	code     websocket.StatusCode // set once, before stopped is closed
	reason   string

	verdicts map[uuid.UUID]verdict // writer goroutine only
}

// newSubscriber prepares a subscriber of p; its conn is set by Hub.start after the upgrade.
func newSubscriber(h *Hub, p *principal.Principal, expires time.Time) *subscriber {
	channels := []Channel{UserChannel(p.UserID), Broadcast()}
	if p.TenantID != uuid.Nil {
		channels = append(channels, OrgChannel(p.TenantID))
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &subscriber{
		hub: h, who: p, expires: expires, channels: channels,
		queue: make(chan outgoing, h.cfg.SendQueue), ctx: ctx, cancel: cancel,
		stopped: make(chan struct{}), verdicts: map[uuid.UUID]verdict{},
	}
}

// stop ends the connection with code and reason (the first call wins). It never blocks:
// the writer goroutine does the close handshake.
func (s *subscriber) stop(code websocket.StatusCode, reason string) {
	s.stopOnce.Do(func() {
		s.code, s.reason = code, reason
		close(s.stopped)
	})
}

// offer queues out without blocking. A full queue means the client cannot keep up:
// the message is dropped (a write error) and the connection is closed with 1008, so
// the client knows to reconnect and resync instead of silently missing messages.
func (s *subscriber) offer(out outgoing) {
	select {
	case <-s.stopped:
		return
	default:
	}
	select {
	case s.queue <- out:
	default:
		s.hub.metrics.WriteErrors.Inc()
		s.stop(websocket.StatusPolicyViolation, "too slow: messages were dropped; reconnect and resync")
	}
}

// run serves the connection until it stops, then closes it.
func (s *subscriber) run() {
	s.conn.SetReadLimit(maxClientMessage)
	go s.read()
	go s.ping()
	s.write()
	_ = s.conn.Close(s.code, s.reason)
	s.cancel()
}

func (s *subscriber) write() {
	for {
		select {
		case <-s.stopped:
			return
		case out := <-s.queue:
			if s.expired() {
				s.stop(websocket.StatusPolicyViolation, "access token expired")
				return
			}
			if out.project != uuid.Nil && !s.canSee(out.project) {
				continue
			}
			ctx, cancel := context.WithTimeout(s.ctx, s.hub.cfg.WriteTimeout)
			err := s.conn.Write(ctx, websocket.MessageText, out.body)
			cancel()
			if err != nil {
				if !out.pong {
					s.hub.metrics.WriteErrors.Inc()
				}
				s.stop(websocket.StatusGoingAway, "write failed")
				return
			}
			if !out.pong {
				s.hub.metrics.Forwarded.Inc()
			}
		}
	}
}

// read enforces what clients may send: small text pings, nothing else. The read limit
// closes a connection that sends more than maxClientMessage bytes (1009).
func (s *subscriber) read() {
	for {
		typ, data, err := s.conn.Read(s.ctx)
		if err != nil {
			s.stop(websocket.StatusNormalClosure, "")
			return
		}
		if typ != websocket.MessageText {
			s.stop(websocket.StatusUnsupportedData, "clients send only text pings")
			return
		}
		if !isPing(data) {
			s.stop(websocket.StatusPolicyViolation, `clients send only {"type":"ping"}`)
			return
		}
		s.offer(outgoing{body: pongBody, pong: true})
	}
}

// ping keeps idle connections alive through load balancers and finds dead peers; it
// also ends a connection whose access token has expired while nothing was sent.
func (s *subscriber) ping() {
	t := time.NewTicker(s.hub.cfg.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stopped:
			return
		case <-t.C:
			if s.expired() {
				s.stop(websocket.StatusPolicyViolation, "access token expired")
				return
			}
			ctx, cancel := context.WithTimeout(s.ctx, s.hub.cfg.WriteTimeout)
			err := s.conn.Ping(ctx)
			cancel()
			if err != nil {
				s.stop(websocket.StatusGoingAway, "ping unanswered")
				return
			}
		}
	}
}

// expired: a connection lives no longer than the access token that opened it, so a
// user whose token is no longer renewed stops receiving.
func (s *subscriber) expired() bool {
	return !s.expires.IsZero() && !s.hub.clock.Now().Before(s.expires)
}

// canSee reports whether the connection's user can see project, from the cache or
// tenancy. When tenancy cannot answer, the message is withheld (fail closed) and the
// question is asked again next time.
func (s *subscriber) canSee(project uuid.UUID) bool {
	now := s.hub.clock.Now()
	if v, ok := s.verdicts[project]; ok && now.Before(v.until) {
		return v.ok
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.hub.cfg.WriteTimeout)
	_, err := s.hub.projects.Access(ctx, s.who, project)
	cancel()
	if err != nil && apierr.CodeOf(err) != apierr.InsufficientPermissions {
		s.hub.log.Warn("notifications: project access unavailable; message withheld", "err", err)
		return false
	}
	if len(s.verdicts) >= maxVerdicts {
		clear(s.verdicts)
	}
	s.verdicts[project] = verdict{ok: err == nil, until: now.Add(accessTTL)}
	return err == nil
}

// pongBody answers a client's {"type":"ping"}.
var pongBody = []byte(`{"type":"pong"}`)

func isPing(data []byte) bool {
	var m struct {
		Type string `json:"type"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(&m) == nil && m.Type == "ping" && !dec.More()
}
