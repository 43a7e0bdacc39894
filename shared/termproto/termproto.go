// Package termproto is the byte protocol of a terminal raw stream between the control
// plane and the node agent, after the fabric preamble (fabricv1.StreamPreamble of kind
// TERMINAL, stream_id = the terminal session id) and the agent's accepting reply.
//
// Both directions carry frames: a 1-byte type, a 4-byte big-endian payload length, and
// the payload. Data frames carry terminal bytes (keystrokes toward the agent, PTY output
// from it). Control frames carry one JSON object with a "type" field.
//
// Window frames acknowledge data bytes, for the terminal's own flow control (flow.go),
// which both sides turn on with a `flow` control frame. Without it, flow control comes
// from the stream itself (yamux / QUIC windows): each side reads a frame only when it
// can pass it on, so nothing is buffered without bound.
package termproto

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Frame types.
const (
	FrameData    byte = 1
	FrameControl byte = 2
)

// MaxPayload bounds one frame; writers split larger data.
const MaxPayload = 32 << 10

// Control message types. Toward the agent: resize, detach (the browser went away; keep
// the session for the grace period), close (end the session). From the agent: ready (the
// PTY is attached; replayed says recent output follows after a terminal reset), exit (the
// shell ended; code is its exit status), error.
const (
	TypeResize = "resize"
	TypeDetach = "detach"
	TypeClose  = "close"
	TypeReady  = "ready"
	TypeExit   = "exit"
	TypeError  = "error"
)

// Control is a control frame's JSON.
type Control struct {
	Type      string `json:"type"`
	SessionID string `json:"session_id,omitempty"`
	Cols      uint16 `json:"cols,omitempty"`
	Rows      uint16 `json:"rows,omitempty"`
	Replayed  bool   `json:"replayed,omitempty"`
	Code      *int   `json:"code,omitempty"`
	ErrorCode string `json:"error_code,omitempty"`
	Message   string `json:"message,omitempty"`
	// Window is a `flow` frame's window in bytes (flow.go).
	Window int `json:"window,omitempty"`
}

// ErrTooLarge is a frame whose declared length exceeds MaxPayload.
var ErrTooLarge = errors.New("termproto: frame too large")

// WriteFrame writes one frame. Payloads over MaxPayload are refused (use WriteData).
func WriteFrame(w io.Writer, typ byte, payload []byte) error {
	if len(payload) > MaxPayload {
		return ErrTooLarge
	}
	var hdr [5]byte
	hdr[0] = typ
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if len(payload) == 0 {
		_, err := w.Write(hdr[:])
		return err
	}
	// One write per frame keeps frames whole on streams shared by several writers'
	// goroutines only if the caller serializes; callers must not write concurrently.
	// The buffer comes from a pool: a bulk output stream writes thousands of frames a
	// second, and a fresh buffer each was most of the terminal path's garbage.
	bp := frameBufs.Get().(*[]byte)
	buf := append(append((*bp)[:0], hdr[:]...), payload...)
	_, err := w.Write(buf)
	*bp = buf[:0]
	frameBufs.Put(bp)
	return err
}

var frameBufs = sync.Pool{New: func() any { b := make([]byte, 0, 5+MaxPayload); return &b }}

// WriteData writes p as one or more data frames.
func WriteData(w io.Writer, p []byte) error {
	for len(p) > 0 {
		n := min(len(p), MaxPayload)
		if err := WriteFrame(w, FrameData, p[:n]); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// WriteControl writes c as a control frame.
func WriteControl(w io.Writer, c Control) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	return WriteFrame(w, FrameControl, b)
}

// ReadFrame reads one frame into buf (grown as needed) and returns its type and payload
// (which aliases buf).
func ReadFrame(r io.Reader, buf []byte) (typ byte, payload []byte, err error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxPayload {
		return 0, nil, ErrTooLarge
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			// The header promised a payload: a stream that ends here was cut mid-frame,
			// which must not read as a clean end between frames (io.EOF).
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, fmt.Errorf("termproto: short frame: %w", err)
	}
	if hdr[0] != FrameData && hdr[0] != FrameControl && hdr[0] != FrameWindow {
		return 0, nil, fmt.Errorf("termproto: unknown frame type %d", hdr[0])
	}
	return hdr[0], buf, nil
}

// ParseControl decodes a control frame's payload.
func ParseControl(p []byte) (Control, error) {
	var c Control
	if err := json.Unmarshal(p, &c); err != nil {
		return c, fmt.Errorf("termproto: control frame: %w", err)
	}
	if c.Type == "" {
		return c, errors.New("termproto: control frame without type")
	}
	return c, nil
}
