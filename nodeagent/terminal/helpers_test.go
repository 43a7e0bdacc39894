package terminal

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"github.com/gantry-gpu/gantry/shared/termproto"
	"github.com/google/uuid"
)

// waitLimit bounds every wait in these tests so a broken session fails the test instead
// of hanging it; nothing asserts how long anything took.
const waitLimit = 15 * time.Second

// envs is the allocation runtime as the terminal sees it: allocations come and go.
type envs struct {
	mu sync.Mutex
	m  map[string]SessionEnv
}

func (e *envs) Session(id string) (SessionEnv, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	env, ok := e.m[id]
	return env, ok
}

func (e *envs) set(id string, env SessionEnv) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.m[id] = env
}

func (e *envs) del(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.m, id)
}

// testEnv is an allocation environment running as the test's own user.
func testEnv(t testing.TB, allocationID string) SessionEnv {
	t.Helper()
	home := t.TempDir()
	return SessionEnv{
		User: "gantry-test",
		Dir:  home,
		Env: []string{
			"HOME=" + home,
			"CUDA_VISIBLE_DEVICES=GPU-11111111-2222-3333-4444-555555555555",
			"GANTRY_ALLOCATION_ID=" + allocationID,
		},
	}
}

// newServer returns a server with one live allocation (its id is returned) and closes it
// at the end of the test.
func newServer(t testing.TB, o Options) (*Server, *envs, string) {
	t.Helper()
	e := &envs{m: map[string]SessionEnv{}}
	alloc := uuid.NewString()
	e.set(alloc, testEnv(t, alloc))
	srv := New(e, o)
	t.Cleanup(srv.Close)
	return srv, e, alloc
}

func preamble(sessionID, allocationID string, command ...string) *fabricv1.StreamPreamble {
	return &fabricv1.StreamPreamble{
		Kind:         fabricv1.StreamKind_STREAM_KIND_TERMINAL,
		StreamId:     sessionID,
		AllocationId: allocationID,
		TerminalSize: &fabricv1.TerminalSize{Cols: 80, Rows: 24},
		Command:      command,
	}
}

type frame struct {
	typ  byte
	data []byte
	ctl  termproto.Control
}

// client is the control plane's end of one terminal stream, over net.Pipe (synchronous:
// a write completes only when the other side reads it, the strictest flow control).
type client struct {
	t      testing.TB
	conn   net.Conn
	rep    *fabricv1.StreamReply
	served chan struct{} // ServeStream returned
	frames chan frame    // nil for a manual client
	out    bytes.Buffer  // data received so far
}

// open sends pre to the server and reads the reply. A client that is not manual reads
// every frame in the background.
func open(t testing.TB, srv *Server, pre *fabricv1.StreamPreamble, manual bool) *client {
	t.Helper()
	a, b := net.Pipe()
	c := &client{t: t, conn: a, served: make(chan struct{})}
	go func() {
		defer close(c.served)
		srv.ServeStream(context.Background(), pre, b)
	}()
	t.Cleanup(func() { _ = a.Close() })
	_ = a.SetReadDeadline(time.Now().Add(waitLimit))
	var rep fabricv1.StreamReply
	if err := fabricnet.ReadFrame(a, &rep); err != nil {
		t.Fatalf("read stream reply: %v", err)
	}
	_ = a.SetReadDeadline(time.Time{})
	c.rep = &rep
	if !rep.GetOk() || manual {
		return c
	}
	c.frames = make(chan frame, 4096)
	go func() {
		defer close(c.frames)
		for {
			typ, p, err := termproto.ReadFrame(a, nil)
			if err != nil {
				return
			}
			f := frame{typ: typ, data: p}
			if typ == termproto.FrameControl {
				if f.ctl, err = termproto.ParseControl(p); err != nil {
					t.Errorf("bad control frame %q: %v", p, err)
					return
				}
			}
			c.frames <- f
		}
	}()
	return c
}

// attach opens a stream that must be accepted and returns it with its ready control.
func attach(t *testing.T, srv *Server, pre *fabricv1.StreamPreamble) (*client, termproto.Control) {
	t.Helper()
	c := open(t, srv, pre, false)
	if !c.rep.GetOk() {
		t.Fatalf("stream refused: %s: %s", c.rep.GetErrorCode(), c.rep.GetMessage())
	}
	return c, c.waitControl(termproto.TypeReady)
}

func (c *client) next() (frame, bool) {
	c.t.Helper()
	select {
	case f, ok := <-c.frames:
		return f, ok
	case <-time.After(waitLimit):
		c.t.Fatalf("no frame from the agent; output so far %q", c.out.String())
		return frame{}, false
	}
}

// waitControl reads until a control of type typ, keeping data; any other control fails.
func (c *client) waitControl(typ string) termproto.Control {
	c.t.Helper()
	for {
		f, ok := c.next()
		if !ok {
			c.t.Fatalf("stream ended before a %s control; output %q", typ, c.out.String())
		}
		if f.typ == termproto.FrameData {
			c.out.Write(f.data)
			continue
		}
		if f.ctl.Type != typ {
			c.t.Fatalf("got control %+v while waiting for %s", f.ctl, typ)
		}
		return f.ctl
	}
}

// waitOutput reads until the output contains s.
func (c *client) waitOutput(s string) {
	c.t.Helper()
	for !strings.Contains(c.out.String(), s) {
		f, ok := c.next()
		if !ok {
			c.t.Fatalf("stream ended before %q appeared; output %q", s, c.out.String())
		}
		if f.typ == termproto.FrameControl {
			c.t.Fatalf("got control %+v while waiting for %q; output %q", f.ctl, s, c.out.String())
		}
		c.out.Write(f.data)
	}
}

// waitEnd reads until the agent closes the stream; a control frame fails.
func (c *client) waitEnd() {
	c.t.Helper()
	for {
		f, ok := c.next()
		if !ok {
			return
		}
		if f.typ == termproto.FrameControl {
			c.t.Fatalf("got control %+v while waiting for the stream to end", f.ctl)
		}
		c.out.Write(f.data)
	}
}

// waitExit reads until the exit control and then the end of the stream.
func (c *client) waitExit() termproto.Control {
	c.t.Helper()
	ctl := c.waitControl(termproto.TypeExit)
	c.waitEnd()
	return ctl
}

func (c *client) send(s string) {
	c.t.Helper()
	_ = c.conn.SetWriteDeadline(time.Now().Add(waitLimit))
	if err := termproto.WriteData(c.conn, []byte(s)); err != nil {
		c.t.Fatalf("send %q: %v", s, err)
	}
}

func (c *client) control(ctl termproto.Control) {
	c.t.Helper()
	_ = c.conn.SetWriteDeadline(time.Now().Add(waitLimit))
	if err := termproto.WriteControl(c.conn, ctl); err != nil {
		c.t.Fatalf("control %+v: %v", ctl, err)
	}
}

// servedOrFail waits until ServeStream returned.
func (c *client) servedOrFail() {
	c.t.Helper()
	select {
	case <-c.served:
	case <-time.After(waitLimit):
		c.t.Fatal("ServeStream did not return")
	}
}

// waitFor polls cond until it holds (failing after waitLimit).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (s *Server) session(id string) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[id]
}

func (s *session) state() state {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}

func waitDone(t *testing.T, sess *session) {
	t.Helper()
	select {
	case <-sess.done:
	case <-time.After(waitLimit):
		t.Fatalf("session %s did not end", sess.id)
	}
}
