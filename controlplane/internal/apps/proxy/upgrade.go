package proxy

import (
	"bufio"
	"net"
	"net/http"
	"sync"
	"time"
)

// trackingWriter is the ResponseWriter the reverse proxy writes to: it notes a failed
// round trip, and a WebSocket's hijacked connection is registered with the service
// (counted in the gauge, closed by Close) and freed of the server's deadlines.
type trackingWriter struct {
	http.ResponseWriter
	s        *Service
	failed   bool
	hijacked bool
}

func (t *trackingWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

func (t *trackingWriter) Flush() { _ = http.NewResponseController(t.ResponseWriter).Flush() }

func (t *trackingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(t.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	_ = c.SetDeadline(time.Time{})
	t.hijacked = true
	u := &upgraded{Conn: c, s: t.s}
	t.s.track(u)
	return u, brw, nil
}

// upgraded is a client connection the proxy carries a WebSocket (or another upgraded
// protocol) on.
type upgraded struct {
	net.Conn
	s    *Service
	once sync.Once
}

func (u *upgraded) Close() error {
	err := u.Conn.Close()
	u.once.Do(func() { u.s.untrack(u) })
	return err
}

func (u *upgraded) close() { _ = u.Close() }

func (s *Service) track(u *upgraded) {
	s.mu.Lock()
	s.upgrade[u] = struct{}{}
	s.mu.Unlock()
	s.metrics.websockets.Inc()
}

func (s *Service) untrack(u *upgraded) {
	s.mu.Lock()
	delete(s.upgrade, u)
	s.mu.Unlock()
	s.metrics.websockets.Dec()
}

// ActiveWebSockets is how many upgraded connections this replica carries now.
func (s *Service) ActiveWebSockets() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.upgrade)
}
