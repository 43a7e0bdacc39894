package termproto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Flow control of terminal bytes, on top of the stream's own.
//
// Why: a terminal stream shares its node's tunnel with every other stream. The tunnel's
// windows are sized for bulk transfers (megabytes, so one stream fills a long link), and
// a terminal printing as fast as it can (`cat` of a large file) fills them: its output
// then queues in the socket buffers ahead of every other session's keystroke echo. A
// terminal needs far less in flight than a bulk transfer to keep its browser busy, so
// each direction of a terminal stream has its own, smaller window, the way SSH's
// channels do: the sender may have at most `window` data bytes that the receiver has
// not acknowledged yet, and the receiver acknowledges them with window frames once it
// has passed them on.
//
// Both sides opt in, so either may be older than the other:
//   - the control plane's first frame is a `flow` control frame with the window it
//     grants the agent's output;
//   - an agent that speaks flow control answers with a `flow` control frame carrying
//     the window it grants input. Output it writes after that answer counts against the
//     control plane's window, and input it reads after the control plane's frame counts
//     against its own;
//   - the control plane sends window frames only once it has seen the answer (an older
//     agent ignores the unknown control type and never sees a window frame, so neither
//     side limits anything), and counts its input from its own `flow` frame on, so
//     both sides count the same bytes.
//
// Window frames are never limited by a window, and each side reads them even while its
// own input waits for the terminal: otherwise a large paste into a program whose output
// is waiting for credit would wait on itself.

// FrameWindow acknowledges data bytes: its 4-byte big-endian payload is how many data
// payload bytes the sender of the window frame has consumed since its previous one.
const FrameWindow byte = 3

// TypeFlow is the control frame that turns flow control on (Control.Window).
const TypeFlow = "flow"

// Window bounds: a peer's window outside them is refused as a protocol error.
const (
	MinWindow = MaxPayload // one full frame must fit, or a writer could never send one
	MaxWindow = 16 << 20
)

// ErrClosed is a credit wait ended because the stream is gone.
var ErrClosed = errors.New("termproto: stream closed")

// ValidWindow reports whether w is an acceptable window size.
func ValidWindow(w int) bool { return w >= MinWindow && w <= MaxWindow }

// WriteWindow writes a window frame acknowledging n bytes (n > 0).
func WriteWindow(w io.Writer, n uint32) error {
	var p [4]byte
	binary.BigEndian.PutUint32(p[:], n)
	return WriteFrame(w, FrameWindow, p[:])
}

// ParseWindow decodes a window frame's payload.
func ParseWindow(p []byte) (uint32, error) {
	if len(p) != 4 {
		return 0, fmt.Errorf("termproto: window frame of %d bytes, want 4", len(p))
	}
	n := binary.BigEndian.Uint32(p)
	if n == 0 {
		return 0, errors.New("termproto: window frame acknowledging nothing")
	}
	return n, nil
}

// Credit is the sending side of one direction's window: how much of the peer's window
// is used by bytes sent and not yet acknowledged. The zero value sends without limit
// and counts nothing until Limit is called. It is safe for concurrent use.
type Credit struct {
	mu     sync.Mutex
	window int64         // 0: no limit (flow control is off)
	used   int64         // sent since counting began, not yet acknowledged
	wake   chan struct{} // closed (and replaced) when credit is returned or on Close
	closed bool
}

// Count starts counting sent bytes against a window that is not known yet: until Limit,
// Take grants everything but records it, so that acknowledgements of those bytes later
// match. The control plane counts from its own flow frame on.
func (c *Credit) Count() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.wake == nil {
		c.wake = make(chan struct{})
	}
}

// Limit sets the window (it turns flow control on; counting starts now unless Count
// started it earlier).
func (c *Credit) Limit(window int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.wake == nil {
		c.wake = make(chan struct{})
	}
	c.window = int64(window)
}

// Take grants up to want bytes (want > 0) and records them as sent. When the window is
// full it grants 0 and returns a channel that is closed once Ack or Close changed
// something; the caller waits on it (and on its own cancellation) and tries again.
// Callers that must write what they take in order (one stream, several writers) call
// Take under the lock that orders their writes.
func (c *Credit) Take(want int) (granted int, wait <-chan struct{}, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, nil, ErrClosed
	}
	if c.wake == nil {
		return want, nil, nil // flow control off: nothing to count
	}
	if c.window == 0 {
		c.used += int64(want)
		return want, nil, nil
	}
	free := c.window - c.used
	if free <= 0 {
		return 0, c.wake, nil
	}
	g := int(min(int64(want), free))
	c.used += int64(g)
	return g, nil, nil
}

// WriteData writes p as data frames within the window. Each frame's credit is taken and
// the frame written under mu, the lock that orders the stream's writes; while the window
// is full it waits without holding mu (control and window frames still go out) until
// credit returns, the credit is closed, or stop is closed (ErrClosed).
func (c *Credit) WriteData(mu sync.Locker, w io.Writer, p []byte, stop <-chan struct{}) error {
	for len(p) > 0 {
		mu.Lock()
		n, wait, err := c.Take(min(len(p), MaxPayload))
		if err == nil && n > 0 {
			err = WriteFrame(w, FrameData, p[:n])
		}
		mu.Unlock()
		if err != nil {
			return err
		}
		if n == 0 {
			select {
			case <-wait:
			case <-stop:
				return ErrClosed
			}
			continue
		}
		p = p[n:]
	}
	return nil
}

// Ack returns n acknowledged bytes. Acknowledging more than was sent is the peer's
// protocol error. After Close it does nothing: a window frame may still be read while
// the stream is being torn down.
func (c *Credit) Ack(n uint32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil // the stream is ending: window frames still on the way change nothing
	}
	if c.wake == nil || int64(n) > c.used {
		return fmt.Errorf("termproto: %d bytes acknowledged, %d in flight", n, c.used)
	}
	c.used -= int64(n)
	close(c.wake)
	c.wake = make(chan struct{})
	return nil
}

// AckFrame applies a window frame's payload p: a malformed frame and one acknowledging
// more than was sent are both the peer's protocol error.
func (c *Credit) AckFrame(p []byte) error {
	n, err := ParseWindow(p)
	if err != nil {
		return err
	}
	return c.Ack(n)
}

// Close fails every present and future Take (the stream ended).
func (c *Credit) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	if c.wake != nil {
		close(c.wake)
	}
}

// InFlight is the number of bytes sent and not yet acknowledged.
func (c *Credit) InFlight() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used
}

// Debt is the receiving side of one direction's window: bytes consumed and not yet
// acknowledged. Acknowledging every frame would double the frames on the stream; one
// acknowledgement per quarter window keeps at least three quarters of the window open
// at the sender while costing one small frame per window/4 bytes.
type Debt struct {
	window int64
	owed   int64
}

// NewDebt returns the debt of a window of the given size.
func NewDebt(window int) *Debt { return &Debt{window: int64(window)} }

// Consumed records n consumed bytes and returns how many to acknowledge now (0: none
// yet).
func (d *Debt) Consumed(n int) uint32 {
	d.owed += int64(n)
	if d.owed < d.window/4 {
		return 0
	}
	ack := uint32(d.owed)
	d.owed = 0
	return ack
}
