package terminal

import (
	"io"
	"strings"
	"testing"
	"time"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/termproto"
	"github.com/google/uuid"
)

// expectRefused asserts the stream was refused with code, closed, and nothing started.
func expectRefused(t *testing.T, srv *Server, c *client, code string, sessionsBefore int) {
	t.Helper()
	if c.rep.GetOk() || c.rep.GetErrorCode() != code {
		t.Fatalf("reply = %+v, want refusal %s", c.rep, code)
	}
	if c.rep.GetMessage() == "" {
		t.Fatal("refusal without a message")
	}
	_ = c.conn.SetReadDeadline(time.Now().Add(waitLimit))
	if _, err := c.conn.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after a refusal the stream must be closed, read: %v", err)
	}
	c.servedOrFail()
	if n := srv.Len(); n != sessionsBefore {
		t.Fatalf("%d sessions after a refusal, want %d", n, sessionsBefore)
	}
}

func TestRefusals(t *testing.T) {
	srv, _, alloc := newServer(t, Options{})
	mod := func(f func(p *fabricv1.StreamPreamble)) *fabricv1.StreamPreamble {
		p := preamble(uuid.NewString(), alloc)
		f(p)
		return p
	}
	cases := []struct {
		name string
		pre  *fabricv1.StreamPreamble
		code string
	}{
		{"app proxy stream", mod(func(p *fabricv1.StreamPreamble) { p.Kind = fabricv1.StreamKind_STREAM_KIND_APP_PROXY }), CodeUnsupportedKind},
		{"unspecified kind", mod(func(p *fabricv1.StreamPreamble) { p.Kind = fabricv1.StreamKind_STREAM_KIND_UNSPECIFIED }), CodeUnsupportedKind},
		{"session id not a UUID", mod(func(p *fabricv1.StreamPreamble) { p.StreamId = "session-1" }), CodeInvalidRequest},
		{"session id in braces", mod(func(p *fabricv1.StreamPreamble) { p.StreamId = "{" + uuid.NewString() + "}" }), CodeInvalidRequest},
		{"allocation id missing", mod(func(p *fabricv1.StreamPreamble) { p.AllocationId = "" }), CodeInvalidRequest},
		{"unknown allocation", mod(func(p *fabricv1.StreamPreamble) { p.AllocationId = uuid.NewString() }), CodeAllocationNotActive},
		{"zero cols", mod(func(p *fabricv1.StreamPreamble) { p.TerminalSize.Cols = 0 }), CodeInvalidRequest},
		{"cols over 1000", mod(func(p *fabricv1.StreamPreamble) { p.TerminalSize.Cols = 1001 }), CodeInvalidRequest},
		{"rows over 1000", mod(func(p *fabricv1.StreamPreamble) { p.TerminalSize.Rows = 1001 }), CodeInvalidRequest},
		{"term with a shell metacharacter", mod(func(p *fabricv1.StreamPreamble) { p.Term = "xterm;reboot" }), CodeInvalidRequest},
		{"term with an escape", mod(func(p *fabricv1.StreamPreamble) { p.Term = "xterm\x1b]0;x" }), CodeInvalidRequest},
		{"term too long", mod(func(p *fabricv1.StreamPreamble) { p.Term = strings.Repeat("x", 65) }), CodeInvalidRequest},
		{"too many arguments", mod(func(p *fabricv1.StreamPreamble) { p.Command = make([]string, 65); p.Command[0] = "sh" }), CodeInvalidRequest},
		{"argument too long", mod(func(p *fabricv1.StreamPreamble) { p.Command = []string{"sh", strings.Repeat("a", 4097)} }), CodeInvalidRequest},
		{"NUL in an argument", mod(func(p *fabricv1.StreamPreamble) { p.Command = []string{"sh", "-c\x00"} }), CodeInvalidRequest},
		{"empty program", mod(func(p *fabricv1.StreamPreamble) { p.Command = []string{"", "x"} }), CodeInvalidRequest},
		{"command too long", mod(func(p *fabricv1.StreamPreamble) {
			p.Command = []string{"sh"}
			for range 5 {
				p.Command = append(p.Command, strings.Repeat("a", 4000))
			}
		}), CodeInvalidRequest},
		{"program not found", mod(func(p *fabricv1.StreamPreamble) { p.Command = []string{"/nonexistent/shell"} }), CodeStartFailed},
		{"program not on PATH", mod(func(p *fabricv1.StreamPreamble) { p.Command = []string{"no-such-program-gantry"} }), CodeStartFailed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			expectRefused(t, srv, open(t, srv, tc.pre, false), tc.code, 0)
		})
	}

	// Accepted edge values, for contrast.
	for _, sz := range [][2]uint32{{1, 1}, {1000, 1000}} {
		p := preamble(uuid.NewString(), alloc, "/bin/sh")
		p.TerminalSize = &fabricv1.TerminalSize{Cols: sz[0], Rows: sz[1]}
		p.Term = "screen.xterm-256color"
		_, ready := attach(t, srv, p)
		if uint32(ready.Cols) != sz[0] || uint32(ready.Rows) != sz[1] {
			t.Fatalf("ready = %+v for %v", ready, sz)
		}
	}
	p := preamble(uuid.NewString(), alloc, "/bin/sh")
	p.TerminalSize = nil
	if _, ready := attach(t, srv, p); ready.Cols != DefaultCols || ready.Rows != DefaultRows {
		t.Fatalf("no size: ready = %+v, want the default", ready)
	}
}

func TestWorkingDirectoryMissing(t *testing.T) {
	srv, e, alloc := newServer(t, Options{})
	e.set(alloc, SessionEnv{Dir: "/nonexistent/home"})
	expectRefused(t, srv, open(t, srv, preamble(uuid.NewString(), alloc), false), CodeStartFailed, 0)
}

func TestSessionIDOfAnotherAllocation(t *testing.T) {
	srv, e, allocA := newServer(t, Options{})
	allocB := uuid.NewString()
	e.set(allocB, testEnv(t, allocB))
	sid := uuid.NewString()
	attach(t, srv, preamble(sid, allocA, "/bin/sh"))
	expectRefused(t, srv, open(t, srv, preamble(sid, allocB), false), CodeSessionConflict, 1)
}

func TestSessionLimits(t *testing.T) {
	srv, e, allocA := newServer(t, Options{MaxSessionsPerAllocation: 2, MaxSessions: 3})
	allocB, allocC := uuid.NewString(), uuid.NewString()
	e.set(allocB, testEnv(t, allocB))
	e.set(allocC, testEnv(t, allocC))

	attach(t, srv, preamble(uuid.NewString(), allocA, "/bin/sh"))
	detached, _ := attach(t, srv, preamble(uuid.NewString(), allocA, "/bin/sh"))
	detached.control(termproto.Control{Type: termproto.TypeDetach})
	detached.waitEnd()
	// A detached session still counts.
	expectRefused(t, srv, open(t, srv, preamble(uuid.NewString(), allocA), false), CodeTooManySessions, 2)
	attach(t, srv, preamble(uuid.NewString(), allocB, "/bin/sh"))
	expectRefused(t, srv, open(t, srv, preamble(uuid.NewString(), allocC), false), CodeTooManySessions, 3)

	defaults := New(&envs{}, Options{})
	if defaults.o.MaxSessionsPerAllocation != 8 || defaults.o.MaxSessions != 64 || defaults.o.DetachedTimeout != 5*time.Minute {
		t.Fatalf("defaults = %+v", defaults.o)
	}
}
