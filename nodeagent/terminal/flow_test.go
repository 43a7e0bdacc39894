package terminal

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/shared/termproto"
)

// startFlow turns the terminal's flow control on with an output window of w bytes and
// returns the agent's answer.
func (c *client) startFlow(w int) termproto.Control {
	c.t.Helper()
	c.control(termproto.Control{Type: termproto.TypeFlow, Window: w})
	return c.waitControl(termproto.TypeFlow)
}

func (c *client) ackOutput(n uint32) {
	c.t.Helper()
	_ = c.conn.SetWriteDeadline(time.Now().Add(waitLimit))
	if err := termproto.WriteWindow(c.conn, n); err != nil {
		c.t.Fatalf("window frame: %v", err)
	}
}

// A shell printing as fast as it can sends exactly the window and then waits for
// window frames; each one lets that much more through.
func TestFlowControlHoldsOutputToTheWindow(t *testing.T) {
	srv, _, alloc := newServer(t, Options{})
	// The output starts only on the keystroke sent after flow control is on, so that all
	// of it counts against the window.
	c, _ := attach(t, srv, preamble(uuid.NewString(), alloc, "/bin/sh", "-c",
		"stty -echo; read go; head -c 1048576 /dev/zero | tr '\\0' x; echo; echo flow-done"))
	const window = termproto.MinWindow
	if ans := c.startFlow(window); ans.Window != InputWindow {
		t.Fatalf("agent's flow answer = %+v, want window %d", ans, InputWindow)
	}
	c.send("go\n")

	got := 0
	for got < window {
		f, ok := c.next()
		if !ok || f.typ != termproto.FrameData {
			t.Fatalf("frame %+v (ok %v) after %d bytes, want output", f, ok, got)
		}
		got += len(f.data)
	}
	if got != window {
		t.Fatalf("%d bytes of output before any window frame, want exactly the window, %d", got, window)
	}
	select {
	case f := <-c.frames:
		t.Fatalf("a frame of %d bytes (type %d) beyond the window before any window frame", len(f.data), f.typ)
	case <-time.After(300 * time.Millisecond):
	}

	// One window frame of 1,000 bytes lets exactly 1,000 more through.
	c.ackOutput(1000)
	more := 0
	for more < 1000 {
		f, ok := c.next()
		if !ok || f.typ != termproto.FrameData {
			t.Fatalf("frame %+v (ok %v), want output", f, ok)
		}
		more += len(f.data)
	}
	if more != 1000 {
		t.Fatalf("%d bytes after acknowledging 1000", more)
	}

	// Acknowledging as it arrives, the rest of the megabyte comes through.
	c.ackOutput(uint32(got + more - 1000))
	var out bytes.Buffer
	for !strings.Contains(out.String(), "flow-done") {
		f, ok := c.next()
		if !ok {
			t.Fatalf("stream ended after %d more bytes", out.Len())
		}
		if f.typ == termproto.FrameData {
			out.Write(f.data)
			// Not c.ackOutput: once the last output is sent the shell exits and the agent
			// closes the stream, while frames sent before may still be in c.frames.
			_ = termproto.WriteWindow(c.conn, uint32(len(f.data)))
		}
	}
	if n := got + more + strings.Count(out.String(), "x"); n < 1<<20 {
		t.Fatalf("%d x's in all, want 1 MiB", n)
	}
}

// A paste far larger than the windows into a program that echoes it: its output waits
// for window frames while its input waits for the program, and neither may wait on the
// other (the agent keeps reading the stream while the PTY does not take input).
func TestFlowControlLargePasteDoesNotDeadlock(t *testing.T) {
	srv, _, alloc := newServer(t, Options{})
	// Without echo: the terminal drops echo it cannot print while output waits (n_tty's
	// echo buffer), whatever the flow control; cat's own output is never dropped.
	c, _ := attach(t, srv, preamble(uuid.NewString(), alloc, "/bin/sh", "-c", "stty -echo; echo paste-now; exec cat"))
	c.waitOutput("paste-now\r\n")
	ans := c.startFlow(termproto.MinWindow)

	var in termproto.Credit
	in.Limit(ans.Window)
	var wmu sync.Mutex // input and window frames share the stream
	write := func(f func() error) error {
		wmu.Lock()
		defer wmu.Unlock()
		_ = c.conn.SetWriteDeadline(time.Now().Add(waitLimit))
		return f()
	}

	// 16,384 lines of 63 characters: cat prints each line back, \n as \r\n.
	const lines = 16384
	line := strings.Repeat("p", 63) + "\n"
	want := lines * (len(line) + 1)
	received := make(chan int, 1)
	var progress atomic.Int64
	go func() {
		debt := termproto.NewDebt(termproto.MinWindow)
		n := 0
		defer func() { received <- n }()
		for f := range c.frames {
			switch f.typ {
			case termproto.FrameData:
				n += len(f.data)
				progress.Store(int64(n))
				if a := debt.Consumed(len(f.data)); a > 0 {
					if write(func() error { return termproto.WriteWindow(c.conn, a) }) != nil {
						return
					}
				}
				if n >= want {
					return
				}
			case termproto.FrameWindow:
				a, err := termproto.ParseWindow(f.data)
				if err == nil {
					err = in.Ack(a)
				}
				if err != nil {
					t.Errorf("agent's window frame: %v", err)
					return
				}
			}
		}
	}()

	paste := []byte(strings.Repeat(line, lines))
	for len(paste) > 0 {
		k, wait, err := in.Take(min(len(paste), termproto.MaxPayload))
		if err != nil {
			t.Fatal(err)
		}
		if k == 0 {
			select {
			case <-wait:
			case <-time.After(waitLimit):
				t.Fatalf("no input window frame for %v with %d bytes left to paste", waitLimit, len(paste))
			}
			continue
		}
		if err := write(func() error { return termproto.WriteFrame(c.conn, termproto.FrameData, paste[:k]) }); err != nil {
			t.Fatalf("paste: %v", err)
		}
		paste = paste[k:]
	}
	select {
	case n := <-received:
		if n != want {
			t.Fatalf("%d bytes of output, want %d", n, want)
		}
	case <-time.After(waitLimit):
		t.Fatalf("the paste's output did not all arrive within %v: %d bytes of %d; input in flight %d", waitLimit, progress.Load(), want, in.InFlight())
	}
}

// A window frame acknowledging more than was sent is a protocol error: the agent says so
// and detaches the stream (the session stays). A window outside the bounds is refused
// and the session goes on without flow control.
func TestFlowControlProtocolErrors(t *testing.T) {
	srv, _, alloc := newServer(t, Options{})
	sid := uuid.NewString()
	c, _ := attach(t, srv, preamble(sid, alloc, "/bin/sh", "-c", "exec cat"))
	c.control(termproto.Control{Type: termproto.TypeFlow, Window: termproto.MinWindow - 1})
	if e := c.waitControl(termproto.TypeError); e.ErrorCode != CodeInvalidRequest || !strings.Contains(e.Message, fmt.Sprint(termproto.MinWindow)) {
		t.Fatalf("error = %+v, want invalid_request naming the bounds", e)
	}
	c.send("still-here\n")
	c.waitOutput("still-here\r\nstill-here")

	c.startFlow(termproto.MaxWindow)
	c.ackOutput(1 << 30)
	if e := c.waitControl(termproto.TypeError); e.ErrorCode != CodeInvalidRequest {
		t.Fatalf("error = %+v, want invalid_request", e)
	}
	c.waitEnd()
	waitFor(t, "the session to be detached", func() bool { return srv.session(sid).state() == stateDetached })
}

// Input the agent read before its stream went away still reaches the shell: here 40,000
// bytes wait in the input queue (the shell sleeps, the PTY holds 4 KiB) when the client
// detaches, and the reattached client sees the shell count all of them.
func TestFlowControlQueuedInputSurvivesADetach(t *testing.T) {
	srv, _, alloc := newServer(t, Options{})
	sid := uuid.NewString()
	c, _ := attach(t, srv, preamble(sid, alloc, "/bin/sh", "-c", "stty raw -echo; echo go-on; sleep 1; head -c 40000 | wc -c; sleep 60"))
	c.waitOutput("go-on")
	c.startFlow(termproto.MinWindow)
	// The second part is queued after the PTY writer took the first and waits in it.
	c.send(strings.Repeat("k", 32768))
	time.Sleep(200 * time.Millisecond)
	c.send(strings.Repeat("k", 40000-32768))
	c.control(termproto.Control{Type: termproto.TypeDetach})
	c.waitEnd()

	sess := srv.session(sid)
	replay := func() string {
		sess.mu.Lock()
		defer sess.mu.Unlock()
		return string(sess.ring.Bytes())
	}
	deadline := time.Now().Add(waitLimit)
	for !strings.Contains(replay(), "40000") {
		if time.Now().After(deadline) {
			t.Fatalf("the shell did not count the queued input; its output %q", replay())
		}
		time.Sleep(10 * time.Millisecond)
	}
	re, ready := attach(t, srv, preamble(sid, alloc))
	if !ready.Replayed {
		t.Fatalf("ready = %+v, want a replay", ready)
	}
	re.waitOutput("40000")
}

// After a close the agent goes on reading the stream: output the dying shell prints
// (here for the whole kill grace, as it ignores SIGHUP) keeps flowing on the client's
// window frames, up to the exit frame. When the agent stopped reading at the close, at
// most one window got through and the exit came only after the drain timeout.
func TestFlowControlOutputFlowsAfterClose(t *testing.T) {
	srv, _, alloc := newServer(t, Options{})
	c, _ := attach(t, srv, preamble(uuid.NewString(), alloc, "/bin/sh", "-c",
		"trap '' HUP; stty -echo; read go; while :; do echo flood-flood-flood-flood-flood; done"))
	const window = termproto.MinWindow
	c.startFlow(window)
	c.send("go\n")

	before, after, unacked := 0, 0, 0
	closed := false
	for {
		f, ok := c.next()
		if !ok {
			t.Fatalf("stream ended without an exit frame (%d bytes after the close)", after)
		}
		if f.typ != termproto.FrameData {
			if f.ctl.Type != termproto.TypeExit {
				t.Fatalf("control %+v before the exit", f.ctl)
			}
			if f.ctl.Message != string(reasonClosed) {
				t.Fatalf("exit %+v, want reason %s", f.ctl, reasonClosed)
			}
			break
		}
		// Acknowledged a quarter window at a time (each acknowledgement is a synchronous
		// write on the pipe: one per frame let a race-instrumented client under load fall
		// so far behind the flood that the agent gave it up as stuck); errors once the
		// agent closed the stream after the exit, whose frame may still be queued here.
		if unacked += len(f.data); unacked >= window/4 {
			_ = termproto.WriteWindow(c.conn, uint32(unacked))
			unacked = 0
		}
		if closed {
			after += len(f.data)
			continue
		}
		if before += len(f.data); before >= window {
			c.control(termproto.Control{Type: termproto.TypeClose})
			closed = true
		}
	}
	if after <= 4*window {
		t.Fatalf("%d bytes of output after the close, want the shell's output for the kill grace (far more than %d)", after, 4*window)
	}
}
