package terminal

import (
	"net"
	"sync"
	"time"

	"github.com/gantry-gpu/gantry/shared/termproto"
)

// replacedWriteTimeout bounds telling a replaced stream why it is being closed (its
// client may have stopped reading, which is often why the user reconnected).
const replacedWriteTimeout = time.Second

// attachment is one stream attached to a session. Every write to the stream goes
// through wmu, so frames from the output pump and control frames never interleave.
type attachment struct {
	conn      net.Conn
	wmu       sync.Mutex
	closeOnce sync.Once
	done      chan struct{}
}

func newAttachment(c net.Conn) *attachment {
	return &attachment{conn: c, done: make(chan struct{})}
}

func (a *attachment) writeData(p []byte) error {
	a.wmu.Lock()
	defer a.wmu.Unlock()
	return termproto.WriteData(a.conn, p)
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
	// The deadline also frees the output pump if it is blocked writing to this stream.
	_ = a.conn.SetWriteDeadline(time.Now().Add(replacedWriteTimeout))
	_ = a.writeControl(termproto.Control{Type: termproto.TypeError, ErrorCode: CodeSessionReplaced, Message: "another client attached to this terminal session"})
	a.close()
}

func (a *attachment) close() {
	a.closeOnce.Do(func() {
		_ = a.conn.Close()
		close(a.done)
	})
}

// serve reads the stream's frames until it ends: keystrokes to the PTY, resize, detach
// and close. A frame is read only after the previous one was handled, so the stream's
// flow control carries the shell's pace back to the client.
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
		if typ == termproto.FrameData {
			if err := s.input(p); err != nil {
				return // the PTY is closed: the session is ending and its end closes att
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
		case termproto.TypeDetach:
			s.lost(att)
			return
		case termproto.TypeClose:
			s.end(reasonClosed)
			return
		default:
			// Unknown control types are ignored so either side can add one first.
		}
	}
}
