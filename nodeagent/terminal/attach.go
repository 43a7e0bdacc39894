package terminal

import (
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/gantry-gpu/gantry/shared/termproto"
)

// replacedWriteTimeout bounds telling a replaced stream why it is being closed (its
// client may have stopped reading, which is often why the user reconnected).
const replacedWriteTimeout = time.Second

// InputWindow is the window the agent grants a stream's input once the control plane
// turns flow control on (termproto flow.go): keystrokes and pastes the PTY has not taken
// yet, held by the agent so that it keeps reading the stream.
const InputWindow = 64 << 10

// attachment is one stream attached to a session. Every write to the stream goes
// through wmu, so frames from the output pump and control frames never interleave.
type attachment struct {
	conn      net.Conn
	wmu       sync.Mutex
	closeOnce sync.Once
	done      chan struct{}

	// out is the control plane's window for this stream's output; flow control is off
	// (out grants everything) until the control plane's flow frame.
	out termproto.Credit
	// in holds input for the PTY once flow control is on (nil before; only serve's
	// goroutine sets it).
	in *inputQueue
}

func newAttachment(c net.Conn) *attachment {
	return &attachment{conn: c, done: make(chan struct{})}
}

// writeData writes output as data frames, each within the control plane's window when
// flow control is on: it waits (without holding wmu, so control frames still go out)
// until window frames return credit, or the attachment closes.
func (a *attachment) writeData(p []byte) error {
	return a.out.WriteData(&a.wmu, a.conn, p, a.done)
}

// startFlow turns flow control on for this stream (the control plane's flow frame,
// granting window bytes of output): output from now on counts against that window, and
// the answer tells the control plane the input window. A second flow frame is ignored.
func (a *attachment) startFlow(s *session, window int) error {
	a.wmu.Lock()
	defer a.wmu.Unlock()
	if a.in != nil {
		return nil
	}
	a.out.Limit(window)
	a.in = newInputQueue(InputWindow)
	go a.in.feed(s, a)
	return termproto.WriteControl(a.conn, termproto.Control{Type: termproto.TypeFlow, Window: InputWindow})
}

// writeWindow acknowledges n input bytes the PTY has taken.
func (a *attachment) writeWindow(n uint32) error {
	a.wmu.Lock()
	defer a.wmu.Unlock()
	return termproto.WriteWindow(a.conn, n)
}

// unblock fails a write that waits on a client that stopped reading: the stream's write
// deadline for one blocked in the stream, the window for one waiting on credit. Frames
// after it need a new deadline, and output no longer gets through.
func (a *attachment) unblock() {
	_ = a.conn.SetWriteDeadline(time.Unix(1, 0))
	a.out.Close()
}

func (a *attachment) writeControl(c termproto.Control) error {
	a.wmu.Lock()
	defer a.wmu.Unlock()
	return termproto.WriteControl(a.conn, c)
}

// notify sends an error notice. It waits its turn behind output like any frame: a client
// that does not read its output does not get to send more frames either.
func (a *attachment) notify(code, message string) {
	_ = a.writeControl(termproto.Control{Type: termproto.TypeError, ErrorCode: code, Message: message})
}

// replaced tells the stream another client took the session over, then closes it.
func (a *attachment) replaced() {
	// The deadline also frees the output pump if it is blocked writing to this stream;
	// closing the window frees it if it waits on credit.
	_ = a.conn.SetWriteDeadline(time.Now().Add(replacedWriteTimeout))
	a.out.Close()
	_ = a.writeControl(termproto.Control{Type: termproto.TypeError, ErrorCode: CodeSessionReplaced, Message: "another client attached to this terminal session"})
	a.close()
}

func (a *attachment) close() {
	a.closeOnce.Do(func() {
		_ = a.conn.Close()
		a.out.Close()
		close(a.done)
	})
}

// serve reads the stream's frames until it ends: keystrokes to the PTY, resize, detach,
// close, and with flow control the control plane's window frames. Without flow control
// a frame is read only after the previous one was handled, so the stream's flow control
// carries the shell's pace back to the client; with it, keystrokes wait in the input
// queue (bounded by InputWindow, which the control plane keeps to) so that window frames
// are read even while the shell does not read its input.
func (s *session) serve(att *attachment) {
	buf := make([]byte, 0, termproto.MaxPayload)
	for {
		typ, p, err := termproto.ReadFrame(att.conn, buf)
		if err != nil {
			s.lost(att)
			return
		}
		if !s.current(att) {
			att.close() // replaced: what it still sends belongs to nobody
			return
		}
		switch typ {
		case termproto.FrameData:
			if att.in != nil {
				if err := att.in.push(p, att.done); err != nil {
					return
				}
				continue
			}
			if err := s.input(p); err != nil {
				return // the PTY is closed: the session is ending and its end closes att
			}
			continue
		case termproto.FrameWindow:
			if err := att.out.AckFrame(p); err != nil {
				att.notify(CodeInvalidRequest, "window frame does not match the output sent")
				s.lost(att)
				return
			}
			continue
		}
		c, err := termproto.ParseControl(p)
		if err != nil {
			att.notify(CodeInvalidRequest, "control frame is not a JSON object with a type")
			continue
		}
		switch c.Type {
		case termproto.TypeResize:
			if !validDimension(uint32(c.Cols)) || !validDimension(uint32(c.Rows)) {
				att.notify(CodeInvalidRequest, "resize cols and rows must be 1..1000")
				continue
			}
			_ = s.resize(c.Cols, c.Rows)
		case termproto.TypeFlow:
			if !termproto.ValidWindow(c.Window) {
				att.notify(CodeInvalidRequest, fmt.Sprintf("flow window must be %d..%d bytes", termproto.MinWindow, termproto.MaxWindow))
				continue
			}
			if err := att.startFlow(s, c.Window); err != nil {
				s.lost(att)
				return
			}
		case termproto.TypeDetach:
			s.lost(att)
			return
		case termproto.TypeClose:
			// Reading goes on until the session's end closes the stream: with flow
			// control the window frames for what the shell prints while it dies come on
			// it, and without them the output pump would wait out the drain timeout and
			// the exit would come seconds late (after the control plane stopped waiting).
			s.end(reasonClosed)
		default:
			// Unknown control types are ignored so either side can add one first.
		}
	}
}
