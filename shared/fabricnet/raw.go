package fabricnet

import (
	"context"
	"fmt"
	"net"
	"time"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// StreamRefusedError is OpenRaw's error when the agent answered the preamble with
// ok=false.
type StreamRefusedError struct {
	Code    string
	Message string
}

func (e *StreamRefusedError) Error() string {
	return fmt.Sprintf("fabricnet: stream refused by agent: %s: %s", e.Code, e.Message)
}

// OpenRaw opens a raw stream toward the agent (control-plane side): it writes pre,
// waits for the agent's StreamReply, and returns the stream ready for payload bytes.
// A refusal is a *StreamRefusedError.
func OpenRaw(ctx context.Context, s Session, pre *fabricv1.StreamPreamble) (net.Conn, error) {
	st, err := s.OpenStream(ctx)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = st.SetDeadline(dl)
	} else {
		_ = st.SetDeadline(time.Now().Add(30 * time.Second))
	}
	stop := context.AfterFunc(ctx, func() { _ = st.SetDeadline(time.Unix(1, 0)) })
	fail := func(err error) (net.Conn, error) {
		stop()
		_ = st.Close()
		return nil, err
	}
	if err := WriteFrame(st, pre); err != nil {
		return fail(fmt.Errorf("fabricnet: write preamble: %w", err))
	}
	var rep fabricv1.StreamReply
	if err := ReadFrame(st, &rep); err != nil {
		return fail(fmt.Errorf("fabricnet: read stream reply: %w", err))
	}
	if !rep.GetOk() {
		return fail(&StreamRefusedError{Code: rep.GetErrorCode(), Message: rep.GetMessage()})
	}
	if !stop() && ctx.Err() != nil {
		return fail(ctx.Err())
	}
	_ = st.SetDeadline(time.Time{})
	return st, nil
}

// ReadPreamble reads the preamble of a stream the control plane opened (agent side).
// Answer it with WriteReply before using the stream.
func ReadPreamble(st net.Conn) (*fabricv1.StreamPreamble, error) {
	var pre fabricv1.StreamPreamble
	if err := ReadFrame(st, &pre); err != nil {
		return nil, err
	}
	return &pre, nil
}

// WriteReply answers a preamble (agent side). After ok=false, close the stream.
func WriteReply(st net.Conn, rep *fabricv1.StreamReply) error { return WriteFrame(st, rep) }
