package terminal

import (
	"encoding/json"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Text frames between the browser and the control plane: one JSON object each, with a
// "type". Binary frames are terminal bytes and carry no framing of ours.

// Server → client.
type (
	readyFrame struct {
		Type      string `json:"type"` // session_ready
		SessionID string `json:"session_id"`
		Cols      int    `json:"cols"`
		Rows      int    `json:"rows"`
		// Replayed: a reattach; a terminal reset and the recent output follow.
		Replayed bool `json:"replayed"`
	}
	exitFrame struct {
		Type string `json:"type"` // exit
		// Code is the shell's exit status; null when the session was ended for it
		// (allocation released) and the node reported none.
		Code *int `json:"code"`
		// Reason is how the session ended when the shell did not end it by itself.
		Reason string `json:"reason,omitempty"`
	}
	errorFrame struct {
		Type  string          `json:"type"` // error
		Error apierr.Envelope `json:"error"`
	}
	pongFrame struct {
		Type string `json:"type"` // pong
	}
)

// clientFrame is a control message from the browser: resize {cols, rows} or ping.
type clientFrame struct {
	Type string `json:"type"`
	Cols int    `json:"cols"`
	Rows int    `json:"rows"`
}

// Frame type names.
const (
	frameSessionReady = "session_ready"
	frameExit         = "exit"
	frameError        = "error"
	framePong         = "pong"
	frameResize       = "resize"
	framePing         = "ping"
)

// parseClientFrame reads one text frame from the browser: a resize with cols and rows
// in [minSize, maxSize] (so they fit termproto's uint16 fields), or a ping. Anything else
// is refused with the error frame's error, and the session goes on.
func parseClientFrame(p []byte) (clientFrame, error) {
	var f clientFrame
	if err := json.Unmarshal(p, &f); err != nil {
		return clientFrame{}, apierr.New(apierr.InvalidRequest, "a text frame must be a JSON control message").With("reason", "bad_control_frame")
	}
	switch f.Type {
	case frameResize:
		if f.Cols < minSize || f.Cols > maxSize || f.Rows < minSize || f.Rows > maxSize {
			return clientFrame{}, apierr.Validation("cols", "cols and rows must be between %d and %d", minSize, maxSize)
		}
	case framePing:
	default:
		return clientFrame{}, apierr.New(apierr.InvalidRequest, "unknown control message type").With("reason", "bad_control_frame")
	}
	return f, nil
}

func marshal(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
