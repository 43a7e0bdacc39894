package terminal

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/gantry-gpu/gantry/shared/termproto"
)

// Measurement helpers for `make bench`: the same probe runs over a direct local PTY (the
// baseline) and over a terminal session (a termproto stream through FrameConn, or a
// WebSocket as a byte stream), so the difference is what the path adds.

// EchoCommand is the program to measure echo with: the terminal driver echoes each
// keystroke at once (non-canonical mode, so no line buffer fills up) and cat consumes
// the input, so the only output is the echo itself.
var EchoCommand = []string{"/bin/sh", "-c", "stty -icanon; exec cat >/dev/null"}

// echoWarmup probes are sent and not recorded: the first ones race the program's start.
const echoWarmup = 10

// EchoRoundTrip types n single keystrokes into rw, one at a time, and returns how long
// each took to come back as echo. rw is a byte stream to a terminal running EchoCommand:
// a LocalEcho, a FrameConn over a session, or a WebSocket's binary stream.
func EchoRoundTrip(rw io.ReadWriter, n int) ([]time.Duration, error) {
	buf := make([]byte, 4096)
	out := make([]time.Duration, 0, n)
	for i := -echoWarmup; i < n; i++ {
		// Letters cycle so a late echo of an earlier probe is never taken for this one
		// (each probe waits for its own echo before the next is sent).
		b := byte('a' + (i+echoWarmup)%26)
		t0 := time.Now()
		if _, err := rw.Write([]byte{b}); err != nil {
			return out, fmt.Errorf("echo probe %d: write: %w", i, err)
		}
		for {
			m, err := rw.Read(buf)
			if bytes.IndexByte(buf[:m], b) >= 0 {
				break
			}
			if err != nil {
				return out, fmt.Errorf("echo probe %d: read: %w", i, err)
			}
		}
		if i >= 0 {
			out = append(out, time.Since(t0))
		}
	}
	return out, nil
}

// ReadUntil reads r until marker has been seen and returns how many bytes that took
// (for output throughput: time it around a large `cat`). Choose a marker that the
// command's own echo does not contain, e.g. type `echo DO\NE` and wait for "DONE".
func ReadUntil(r io.Reader, marker []byte) (int64, error) {
	if len(marker) == 0 {
		return 0, errors.New("terminal: empty marker")
	}
	buf := make([]byte, 64<<10)
	var tail []byte
	var total int64
	for {
		m, err := r.Read(buf)
		total += int64(m)
		if m > 0 {
			tail = append(tail, buf[:m]...)
			if bytes.Contains(tail, marker) {
				return total, nil
			}
			if keep := len(marker) - 1; len(tail) > keep {
				tail = append(tail[:0], tail[len(tail)-keep:]...)
			}
		}
		if err != nil {
			return total, err
		}
	}
}

// FrameConn turns a termproto stream (the control plane's end of a terminal stream,
// after OpenRaw) into a plain byte stream: Write sends data frames, Read returns the
// payload of data frames. A `ready` control is skipped, `exit` ends the stream (io.EOF)
// and `error` is returned as an error.
type FrameConn struct {
	rw      io.ReadWriter
	buf     []byte
	pending []byte
	// Exit is the exit control once one has been read.
	Exit *termproto.Control
}

// NewFrameConn wraps the stream rw.
func NewFrameConn(rw io.ReadWriter) *FrameConn { return &FrameConn{rw: rw} }

// Write sends p as data frames.
func (c *FrameConn) Write(p []byte) (int, error) {
	if err := termproto.WriteData(c.rw, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Control sends a control frame (resize, detach, close).
func (c *FrameConn) Control(ctl termproto.Control) error { return termproto.WriteControl(c.rw, ctl) }

// Read returns terminal output.
func (c *FrameConn) Read(p []byte) (int, error) {
	for len(c.pending) == 0 {
		if c.Exit != nil {
			return 0, io.EOF
		}
		typ, payload, err := termproto.ReadFrame(c.rw, c.buf)
		if err != nil {
			return 0, err
		}
		c.buf = payload[:0]
		if typ == termproto.FrameData {
			c.pending = payload
			break
		}
		ctl, err := termproto.ParseControl(payload)
		if err != nil {
			return 0, err
		}
		switch ctl.Type {
		case termproto.TypeExit:
			c.Exit = &ctl
		case termproto.TypeError:
			return 0, fmt.Errorf("terminal: %s: %s", ctl.ErrorCode, ctl.Message)
		}
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

// LocalEcho starts argv (EchoCommand when empty) on a PTY of this host, with no agent,
// stream or session in between: the baseline the terminal path is compared with.
// Closing it kills the program.
func LocalEcho(argv ...string) (io.ReadWriteCloser, error) {
	if len(argv) == 0 {
		argv = EchoCommand
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=" + defaultPath, "TERM=" + DefaultTerm}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	master, err := startPTY(cmd, DefaultCols, DefaultRows, nil)
	if err != nil {
		return nil, err
	}
	return &localPTY{File: master, cmd: cmd}, nil
}

type localPTY struct {
	*os.File
	cmd *exec.Cmd
}

func (l *localPTY) Close() error {
	_ = syscall.Kill(-l.cmd.Process.Pid, syscall.SIGKILL)
	err := l.File.Close()
	_ = l.cmd.Wait()
	return err
}
