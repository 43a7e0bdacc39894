package storagemount

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// Raw read streams run on a lane: the tunnel itself, or, when the agent gave a
// fabricnet.SideDialer, what it dials beside the tunnel: bulk connections where the
// control plane takes them (fabricnet.BulkConns: each stream its own TLS+TCP
// connection, with no yamux between the stream and TLS), else, on a QUIC tunnel, a bulk
// side session (TLS+TCP, about 2.4 times cheaper per byte than quic-go). Either is a
// fabricnet.Session here, and called the side session below. A lane keeps the streams
// that delivered a whole range for the next read (on bulk connections, the connections
// themselves).

// Side session timing. bulkIdle: a side session with no stream in use for this long is
// closed (its kept streams, idle 15 s at most, go with it). bulkRetry: after a side
// session failed to open (TCP blocked, refused) or broke, reads stay on the tunnel this
// long before another is tried. bulkDialTimeout bounds one dial.
const (
	bulkIdle        = 30 * time.Second
	bulkRetry       = 2 * time.Minute
	bulkDialTimeout = 10 * time.Second
)

// rawLane is a session raw read streams are opened on, with the streams it keeps.
type rawLane struct {
	sess fabricnet.Session

	mu      sync.Mutex
	idle    []idleStream // streams that finished a range, for the next
	busy    int          // streams handed to readers and not back yet
	lastUse time.Time    // when busy last changed
}

type idleStream struct {
	st    *laneStream
	since time.Time
}

// laneStream is a raw read stream of a lane; it counts as busy from when a reader
// takes it until it is put back or closed.
type laneStream struct {
	net.Conn
	lane *rawLane
	out  atomic.Bool
}

func (s *laneStream) Close() error {
	if s.out.Swap(false) {
		s.lane.release()
	}
	return s.Conn.Close()
}

func (l *rawLane) take(st *laneStream) *laneStream {
	st.out.Store(true)
	l.mu.Lock()
	l.busy++
	l.lastUse = time.Now()
	l.mu.Unlock()
	return st
}

func (l *rawLane) release() {
	l.mu.Lock()
	l.busy--
	l.lastUse = time.Now()
	l.mu.Unlock()
}

// open opens a new raw read stream on the lane and sends req (fabricnet.OpenAgentStream).
func (l *rawLane) open(ctx context.Context, req proto.Message) (*laneStream, error) {
	st, err := fabricnet.OpenAgentStream(ctx, l.sess, fabricnet.AgentStreamStorageRead, req)
	if err != nil {
		return nil, err
	}
	return l.take(&laneStream{Conn: st, lane: l}), nil
}

// takeIdle returns a kept stream of the lane (nil: none), closing stale ones.
func (l *rawLane) takeIdle(now time.Time) *laneStream {
	l.mu.Lock()
	var st *laneStream
	for len(l.idle) > 0 && st == nil {
		last := l.idle[len(l.idle)-1]
		l.idle = l.idle[:len(l.idle)-1]
		if now.Sub(last.since) < rawIdleFor {
			st = last.st
		} else {
			_ = last.st.Close()
		}
	}
	l.mu.Unlock()
	if st == nil {
		return nil
	}
	return l.take(st)
}

// putIdle keeps st for the next read, or closes it when the pool is full or the lane's
// session has ended.
func (l *rawLane) putIdle(st *laneStream, now time.Time) {
	if st.out.Swap(false) {
		l.release()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.sess.Done():
		_ = st.Close()
		return
	default:
	}
	if len(l.idle) >= idleRaw {
		_ = st.Close()
		return
	}
	l.idle = append(l.idle, idleStream{st: st, since: now})
}

// idleSince reports whether no stream of the lane is in use, and since when.
func (l *rawLane) idleSince() (bool, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.busy == 0, l.lastUse
}

// bulkSide is the bulk side session of one tunnel: dialled in the background on the
// first raw read (that read, and those until it is up, use the tunnel), reused, closed
// when idle for bulkIdle and when the tunnel ends. A dial that fails, or a side session
// that breaks, leaves reads on the tunnel for bulkRetry.
type bulkSide struct {
	dial fabricnet.SideDialer
	// idleAfter and retryAfter are bulkIdle and bulkRetry (tests shorten them).
	idleAfter, retryAfter time.Duration

	ctx    context.Context // ends with the tunnel: cancels a dial under way
	cancel context.CancelFunc

	mu      sync.Mutex
	lane    *rawLane // the live side session's; nil when none
	dialing bool
	retryAt time.Time
	timer   *time.Timer // the idle check
	closed  bool
	// dials and failures count attempts and their failures (tests).
	dials, failures int
}

func newBulkSide(dial fabricnet.SideDialer) *bulkSide {
	ctx, cancel := context.WithCancel(context.Background())
	return &bulkSide{dial: dial, idleAfter: bulkIdle, retryAfter: bulkRetry, ctx: ctx, cancel: cancel}
}

// current returns the side session's lane, or nil while there is none: then it starts
// a dial unless one is under way or a recent failure holds them off.
func (b *bulkSide) current() *rawLane {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	if l := b.lane; l != nil {
		select {
		case <-l.sess.Done():
			// Broken (or closed by the control plane, whose main session ended): the
			// tunnel carries reads until the retry time.
			b.dropLocked()
		default:
			return l
		}
	}
	if !b.dialing && !time.Now().Before(b.retryAt) {
		b.dialing = true
		b.dials++
		go b.dialSide()
	}
	return nil
}

func (b *bulkSide) dialSide() {
	ctx, cancel := context.WithTimeout(b.ctx, bulkDialTimeout)
	s, err := b.dial(ctx)
	cancel()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dialing = false
	if err != nil {
		b.retryAt = time.Now().Add(b.retryAfter)
		b.failures++
		return
	}
	if b.closed {
		_ = s.Close("tunnel ended")
		return
	}
	b.lane = &rawLane{sess: s, lastUse: time.Now()}
	b.armIdle(b.lane, b.idleAfter)
}

// armIdle schedules l's idle check; b.mu held.
func (b *bulkSide) armIdle(l *rawLane, d time.Duration) {
	b.timer = time.AfterFunc(d, func() { b.checkIdle(l) })
}

// checkIdle closes the side session l when no stream of it was in use for idleAfter.
func (b *bulkSide) checkIdle(l *rawLane) {
	b.mu.Lock()
	if b.lane != l || b.closed {
		b.mu.Unlock()
		return
	}
	idle, since := l.idleSince()
	if wait := b.idleAfter - time.Since(since); !idle || wait > 0 {
		if !idle {
			wait = b.idleAfter
		}
		b.armIdle(l, wait)
		b.mu.Unlock()
		return
	}
	b.lane = nil
	b.mu.Unlock()
	_ = l.sess.Close("bulk side session idle")
}

// failed drops l after a stream on it failed for a reason other than the control
// plane's answer: reads go back to the tunnel for bulkRetry.
func (b *bulkSide) failed(l *rawLane) {
	b.mu.Lock()
	if b.lane == l {
		b.dropLocked()
	}
	b.mu.Unlock()
	_ = l.sess.Close("bulk stream failed")
}

// dropLocked forgets the current side session as failed: reads stay on the tunnel
// until retryAfter has passed. b.mu held.
func (b *bulkSide) dropLocked() {
	b.lane, b.retryAt = nil, time.Now().Add(b.retryAfter)
	b.failures++
}

// close ends the side session with the tunnel.
func (b *bulkSide) close() {
	b.mu.Lock()
	b.closed = true
	l := b.lane
	b.lane = nil
	if b.timer != nil {
		b.timer.Stop()
	}
	b.mu.Unlock()
	b.cancel()
	if l != nil {
		_ = l.sess.Close("tunnel ended")
	}
}

// BulkStats says what the current tunnel's bulk side session did: dials attempted,
// how many failed or broke, and whether one is up now (tests, status).
type BulkStats struct {
	Dials, Failures int
	Up              bool
}

// BulkStats reports on the current tunnel's bulk side session (zero without one).
func (c *Conns) BulkStats() BulkStats {
	t, _ := c.current()
	if t == nil || t.bulk == nil {
		return BulkStats{}
	}
	b := t.bulk
	b.mu.Lock()
	defer b.mu.Unlock()
	return BulkStats{Dials: b.dials, Failures: b.failures, Up: b.lane != nil}
}
