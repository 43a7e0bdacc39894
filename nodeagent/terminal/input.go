package terminal

import (
	"sync"

	"github.com/gantry-gpu/gantry/shared/termproto"
)

// inputQueue holds a flow-controlled stream's keystrokes until the PTY takes them, so
// that the stream goes on being read while the shell does not read its input. Its bound
// is the input window the agent granted: the control plane sends no more than that
// unacknowledged, except for what it sent before it heard the grant; push waits for
// room then, as the agent without flow control waits for the PTY.
type inputQueue struct {
	limit int

	mu     sync.Mutex
	chunks [][]byte
	bytes  int
	ready  chan struct{} // 1-buffered: a chunk was queued
	room   chan struct{} // 1-buffered: chunks were taken
}

func newInputQueue(limit int) *inputQueue {
	return &inputQueue{limit: limit, ready: make(chan struct{}, 1), room: make(chan struct{}, 1)}
}

// push queues a copy of p (p aliases the stream's read buffer), waiting while the queue
// is full; it fails once done is closed.
func (q *inputQueue) push(p []byte, done <-chan struct{}) error {
	c := append([]byte(nil), p...)
	for {
		q.mu.Lock()
		if q.bytes == 0 || q.bytes+len(c) <= q.limit {
			q.chunks = append(q.chunks, c)
			q.bytes += len(c)
			q.mu.Unlock()
			signal(q.ready)
			return nil
		}
		q.mu.Unlock()
		select {
		case <-q.room:
		case <-done:
			return termproto.ErrClosed
		}
	}
}

// take removes every queued chunk.
func (q *inputQueue) take() [][]byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	c := q.chunks
	q.chunks = nil
	return c
}

// taken frees room for n bytes the PTY took.
func (q *inputQueue) taken(n int) {
	q.mu.Lock()
	q.bytes -= n
	q.mu.Unlock()
	signal(q.room)
}

// feed writes queued input to the PTY in order and acknowledges it to the control plane
// (a window frame per quarter window taken), until the attachment closes or the PTY
// does. Input the agent read before its stream closed still reaches the PTY, as it did
// when each frame was written before the next was read.
func (q *inputQueue) feed(s *session, att *attachment) {
	debt := termproto.NewDebt(q.limit)
	for {
		select {
		case <-q.ready:
		case <-att.done:
			for _, c := range q.take() {
				if s.input(c) != nil {
					return
				}
			}
			return
		}
		for _, c := range q.take() {
			if err := s.input(c); err != nil {
				return // the PTY is closed: the session is ending
			}
			q.taken(len(c))
			if n := debt.Consumed(len(c)); n > 0 {
				// An error means the stream failed (its reader detaches it): the rest of
				// the queue still goes to the PTY.
				_ = att.writeWindow(n)
			}
		}
	}
}

// signal wakes a 1-buffered channel's waiter without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
