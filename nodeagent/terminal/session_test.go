package terminal

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/termproto"
	"github.com/google/uuid"
)

// A login shell on a real PTY: the allocation's environment and TERM (never the agent's
// environment), echo a command, resize and see it in `stty size`, exit code forwarded.
func TestSessionHappyPath(t *testing.T) {
	t.Setenv("GANTRY_TEST_AGENT_SECRET", "must-not-leak")
	srv, e, alloc := newServer(t, Options{})
	env, _ := e.Session(alloc)
	env.Shell = "/bin/bash"
	e.set(alloc, env)
	sid := uuid.NewString()

	c, ready := attach(t, srv, preamble(sid, alloc))
	if ready.SessionID != sid || ready.Cols != 80 || ready.Rows != 24 || ready.Replayed {
		t.Fatalf("ready = %+v, want session %s, 80x24, not replayed", ready, sid)
	}

	// $((6*7)) makes the output differ from the echoed command line.
	c.send(`echo "m-$((6*7)) t:$TERM c:$CUDA_VISIBLE_DEVICES a:$GANTRY_ALLOCATION_ID s:${GANTRY_TEST_AGENT_SECRET:-unset} d:$(pwd)"` + "\n")
	c.waitOutput(fmt.Sprintf("m-42 t:xterm-256color c:GPU-11111111-2222-3333-4444-555555555555 a:%s s:unset d:%s", alloc, env.Dir))

	c.send(`echo "sz-$((1+1)):$(stty size)"` + "\n")
	c.waitOutput("sz-2:24 80")
	c.control(termproto.Control{Type: termproto.TypeResize, Cols: 132, Rows: 43})
	c.send(`echo "sz-$((2+1)):$(stty size)"` + "\n")
	c.waitOutput("sz-3:43 132")

	c.send("exit 7\n")
	exit := c.waitExit()
	if exit.Code == nil || *exit.Code != 7 || exit.Message != "exited" || exit.SessionID != sid {
		t.Fatalf("exit = %+v, want code 7, exited", exit)
	}
	c.servedOrFail()
	if n := srv.Len(); n != 0 {
		t.Fatalf("%d sessions left after exit", n)
	}
}

func TestExitStatus(t *testing.T) {
	cases := []struct {
		name    string
		command []string
		output  string
		code    int
	}{
		{"status", []string{"/bin/sh", "-c", "echo last-words; exit 3"}, "last-words", 3},
		{"success", []string{"/bin/sh", "-c", "true"}, "", 0},
		{"killed by a signal", []string{"/bin/sh", "-c", "echo dying; kill -KILL $$"}, "dying", 128 + 9},
		{"command from PATH", []string{"sh", "-c", "exit 42"}, "", 42},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv, _, alloc := newServer(t, Options{})
			c, _ := attach(t, srv, preamble(uuid.NewString(), alloc, tc.command...))
			exit := c.waitExit()
			if exit.Code == nil || *exit.Code != tc.code || exit.Message != "exited" {
				t.Fatalf("exit = %+v, want code %d", exit, tc.code)
			}
			// Output written just before the exit arrives before the exit control.
			if !strings.Contains(c.out.String(), tc.output) {
				t.Fatalf("output %q lacks %q", c.out.String(), tc.output)
			}
			c.servedOrFail()
			if srv.Len() != 0 {
				t.Fatal("session left after exit")
			}
		})
	}
}

// A detach, and a stream that just drops, keep the session; a reattach with the same
// session id gets ready(replayed), a reset, the earlier output, then live output.
func TestDetachAndReattachReplays(t *testing.T) {
	srv, _, alloc := newServer(t, Options{})
	sid := uuid.NewString()
	c1, _ := attach(t, srv, preamble(sid, alloc, "/bin/sh"))
	c1.send(`echo "one-$((1+1))"` + "\n")
	c1.waitOutput("one-2")
	c1.control(termproto.Control{Type: termproto.TypeDetach})
	c1.waitEnd()
	c1.servedOrFail()
	sess := srv.session(sid)
	if sess == nil || sess.state() != stateDetached {
		t.Fatalf("session after detach: %v", sess)
	}

	pre := preamble(sid, alloc) // a reattach's command is irrelevant
	pre.TerminalSize.Cols, pre.TerminalSize.Rows = 100, 30
	c2, ready := attach(t, srv, pre)
	if !ready.Replayed || ready.SessionID != sid || ready.Cols != 100 || ready.Rows != 30 {
		t.Fatalf("ready = %+v, want replayed, 100x30", ready)
	}
	f, ok := c2.next()
	if !ok || f.typ != termproto.FrameData || !strings.HasPrefix(string(f.data), "\x1bc") || !strings.Contains(string(f.data), "one-2") {
		t.Fatalf("first frame after ready = %q, want a reset then the earlier output", f.data)
	}
	c2.send(`echo "two-$((2+1)):$(stty size)"` + "\n")
	c2.waitOutput("two-3:30 100")

	// The stream drops without a word (browser tab closed, tunnel lost).
	_ = c2.conn.Close()
	c2.servedOrFail()
	waitFor(t, "the session to be detached", func() bool { return sess.state() == stateDetached })

	pre = preamble(sid, alloc)
	pre.TerminalSize = nil // no size: the session keeps its own
	c3, ready := attach(t, srv, pre)
	if !ready.Replayed || ready.Cols != 100 || ready.Rows != 30 {
		t.Fatalf("ready = %+v, want replayed with the session's size", ready)
	}
	f, _ = c3.next()
	if !strings.HasPrefix(string(f.data), "\x1bc") || !strings.Contains(string(f.data), "one-2") || !strings.Contains(string(f.data), "two-3:30 100") {
		t.Fatalf("replay = %q", f.data)
	}
	c3.control(termproto.Control{Type: termproto.TypeClose})
	exit := c3.waitExit()
	if exit.Code == nil || *exit.Code != -1 || exit.Message != "closed" {
		t.Fatalf("exit after close = %+v, want -1 closed", exit)
	}
	c3.servedOrFail()
	waitDone(t, sess)
	if srv.Len() != 0 {
		t.Fatal("session left after close")
	}
}

// The replay is the most recent 64 KiB, not everything.
func TestReplayIsBounded(t *testing.T) {
	srv, _, alloc := newServer(t, Options{})
	sid := uuid.NewString()
	// 200,000 bytes of numbered lines, then a marker.
	c1, _ := attach(t, srv, preamble(sid, alloc, "/bin/sh", "-c", `i=0; while [ $i -lt 20000 ]; do echo "line-$i"; i=$((i+1)); done; echo "end-of-lines"; exec cat >/dev/null`))
	c1.waitOutput("end-of-lines")
	c1.control(termproto.Control{Type: termproto.TypeDetach})
	c1.waitEnd()

	c2, _ := attach(t, srv, preamble(sid, alloc))
	f, _ := c2.next()
	replay := string(f.data)
	for !strings.HasSuffix(replay, "end-of-lines\r\n") {
		g, _ := c2.next()
		replay += string(g.data)
	}
	if got := len(replay) - len("\x1bc"); got != ReplayBytes {
		t.Fatalf("replayed %d bytes, want exactly %d", got, ReplayBytes)
	}
	if strings.Contains(replay, "line-0\r\n") || !strings.Contains(replay, "line-19999\r\n") {
		t.Fatal("replay is not the most recent output")
	}
}

// A second stream for an attached session takes it over; the first is told and closed.
func TestSecondAttachReplacesFirst(t *testing.T) {
	srv, _, alloc := newServer(t, Options{})
	sid := uuid.NewString()
	c1, _ := attach(t, srv, preamble(sid, alloc, "/bin/sh"))
	c1.send(`echo "first-$((3*3))"` + "\n")
	c1.waitOutput("first-9")

	c2, ready := attach(t, srv, preamble(sid, alloc))
	if !ready.Replayed {
		t.Fatalf("ready = %+v, want replayed", ready)
	}
	replaced := c1.waitControl(termproto.TypeError)
	if replaced.ErrorCode != CodeSessionReplaced {
		t.Fatalf("first stream got %+v, want %s", replaced, CodeSessionReplaced)
	}
	c1.waitEnd()
	c1.servedOrFail()

	c2.send(`echo "second-$((4*4))"` + "\n")
	c2.waitOutput("second-16")
	if srv.Len() != 1 || srv.session(sid).state() != stateAttached {
		t.Fatal("the session is not attached to the second stream")
	}
}

// A session nobody is attached to ends after the detached timeout of the injected clock;
// an attached one never does. A late reattach is told the session ended.
func TestDetachedSessionExpires(t *testing.T) {
	for _, timeout := range []time.Duration{0, time.Minute} {
		want := timeout
		if want == 0 {
			want = DefaultDetachedTimeout
		}
		t.Run(want.String(), func(t *testing.T) {
			clk := clock.NewManual(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
			srv, _, alloc := newServer(t, Options{DetachedTimeout: timeout, Clock: clk})
			sid := uuid.NewString()
			c1, _ := attach(t, srv, preamble(sid, alloc, "/bin/sh"))
			c1.control(termproto.Control{Type: termproto.TypeDetach})
			c1.waitEnd()
			idle := srv.session(sid)

			other, _ := attach(t, srv, preamble(uuid.NewString(), alloc, "/bin/sh"))

			clk.Advance(want - time.Second)
			if n := srv.ReapDetached(); n != 0 {
				t.Fatalf("reaped %d sessions before the timeout", n)
			}
			clk.Advance(time.Second)
			if n := srv.ReapDetached(); n != 1 {
				t.Fatalf("reaped %d sessions at the timeout, want 1", n)
			}
			waitDone(t, idle)
			if idle.exitCode != -1 || idle.reason != reasonIdle {
				t.Fatalf("ended with %d %s", idle.exitCode, idle.reason)
			}
			clk.Advance(time.Hour)
			if n := srv.ReapDetached(); n != 0 {
				t.Fatalf("reaped %d attached sessions", n)
			}
			if srv.Len() != 1 {
				t.Fatalf("%d sessions, want the attached one", srv.Len())
			}
			other.send(`echo "alive-$((5+5))"` + "\n")
			other.waitOutput("alive-10")

			late := open(t, srv, preamble(sid, alloc), false)
			if late.rep.GetOk() || late.rep.GetErrorCode() != CodeSessionEnded {
				t.Fatalf("late reattach: %+v, want %s", late.rep, CodeSessionEnded)
			}
		})
	}
}

// EndAllocation ends the allocation's sessions (attached or not) with exit -1, and no
// other allocation's.
func TestEndAllocation(t *testing.T) {
	srv, e, allocA := newServer(t, Options{})
	allocB := uuid.NewString()
	e.set(allocB, testEnv(t, allocB))

	a1, _ := attach(t, srv, preamble(uuid.NewString(), allocA))
	a2id := uuid.NewString()
	a2, _ := attach(t, srv, preamble(a2id, allocA, "/bin/sh"))
	a2.control(termproto.Control{Type: termproto.TypeDetach})
	a2.waitEnd()
	b1, _ := attach(t, srv, preamble(uuid.NewString(), allocB, "/bin/sh"))

	e.del(allocA) // the runtime stops treating it as live first, then ends its sessions
	if n := srv.EndAllocation(allocA); n != 2 {
		t.Fatalf("EndAllocation ended %d sessions, want 2", n)
	}
	exit := a1.waitExit()
	if exit.Code == nil || *exit.Code != -1 || exit.Message != "allocation_released" {
		t.Fatalf("exit = %+v, want -1 allocation_released", exit)
	}
	a1.servedOrFail()
	if srv.Len() != 1 {
		t.Fatalf("%d sessions left, want allocation B's", srv.Len())
	}
	b1.send(`echo "b-$((7*7))"` + "\n")
	b1.waitOutput("b-49")
	if late := open(t, srv, preamble(a2id, allocA), false); late.rep.GetOk() || late.rep.GetErrorCode() != CodeAllocationNotActive {
		t.Fatalf("reattach after release: %+v", late.rep)
	}
	if n := srv.EndAllocation(allocA); n != 0 {
		t.Fatalf("second EndAllocation ended %d", n)
	}
}

// Close (agent shutdown) ends everything and refuses new streams.
func TestCloseEndsSessions(t *testing.T) {
	srv, _, alloc := newServer(t, Options{})
	c, _ := attach(t, srv, preamble(uuid.NewString(), alloc, "/bin/sh"))
	// A shell that ignores SIGHUP is killed after the grace.
	c.send("trap '' HUP; echo \"trapped-$((8+8))\"\n")
	c.waitOutput("trapped-16")
	srv.Close()
	exit := c.waitExit()
	if exit.Code == nil || *exit.Code != -1 || exit.Message != "agent_shutdown" {
		t.Fatalf("exit = %+v", exit)
	}
	if srv.Len() != 0 {
		t.Fatal("sessions left after Close")
	}
	late := open(t, srv, preamble(uuid.NewString(), alloc), false)
	if late.rep.GetOk() || late.rep.GetErrorCode() != CodeShuttingDown {
		t.Fatalf("after Close: %+v", late.rep)
	}
}

// Input is never dropped: 200,000 bytes pasted into a program reading through a 4 KiB
// terminal buffer all arrive.
func TestInputIsNotDropped(t *testing.T) {
	srv, _, alloc := newServer(t, Options{})
	const size = 200_000
	c, _ := attach(t, srv, preamble(uuid.NewString(), alloc, "/bin/sh", "-c",
		fmt.Sprintf(`stty -icanon -echo; echo "ready-$((2*2))"; head -c %d | wc -c; exec cat >/dev/null`, size)))
	c.waitOutput("ready-4")
	chunk := strings.Repeat("abcdefghij", 1000)
	for sent := 0; sent < size; sent += len(chunk) {
		c.send(chunk)
	}
	c.waitOutput(fmt.Sprint(size))
}

// Errors about bad control frames do not end the session.
func TestBadControlFrames(t *testing.T) {
	srv, _, alloc := newServer(t, Options{})
	c, _ := attach(t, srv, preamble(uuid.NewString(), alloc, "/bin/sh"))
	c.control(termproto.Control{Type: termproto.TypeResize, Cols: 0, Rows: 10})
	if ctl := c.waitControl(termproto.TypeError); ctl.ErrorCode != CodeInvalidRequest {
		t.Fatalf("bad resize: %+v", ctl)
	}
	c.control(termproto.Control{Type: termproto.TypeResize, Cols: 1001, Rows: 10})
	if ctl := c.waitControl(termproto.TypeError); ctl.ErrorCode != CodeInvalidRequest {
		t.Fatalf("bad resize: %+v", ctl)
	}
	c.control(termproto.Control{Type: "something-new"}) // ignored
	c.send(`echo "sz-$((9+9)):$(stty size)"` + "\n")
	c.waitOutput("sz-18:24 80")
}

func TestRunAsAllocationUser(t *testing.T) {
	srv, e, alloc := newServer(t, Options{})
	uid, gid := uint32(os.Getuid()), uint32(os.Getgid())
	if uid == 0 {
		uid, gid = 65534, 65534 // nobody, to see the switch
	}
	e.set(alloc, SessionEnv{User: "nobody", RealUser: true, UID: uid, GID: gid, Dir: "/tmp", Env: []string{"HOME=/tmp"}})
	c, _ := attach(t, srv, preamble(uuid.NewString(), alloc, "/bin/sh", "-c", `echo "id:$(id -u):$(id -g):$(id -G)"; stat -c "tty:%u" "$(tty)"`))
	c.waitExit()
	want := fmt.Sprintf("id:%d:%d:", uid, gid)
	if !strings.Contains(c.out.String(), want) {
		t.Fatalf("output %q lacks %q", c.out.String(), want)
	}
	if os.Getuid() == 0 {
		if !strings.Contains(c.out.String(), "id:65534:65534:65534\r\n") || !strings.Contains(c.out.String(), "tty:65534") {
			t.Fatalf("output %q: want only nobody's group and a terminal owned by nobody", c.out.String())
		}
	}
}
