package terminal

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/shared/termproto"
	"github.com/google/uuid"
)

// A client that stops reading stops the shell: the agent holds at most one read buffer
// of output (plus the 64 KiB ring), `yes` blocks on the full terminal, and output
// resumes, intact, when the client reads again.
func TestBackpressureBlocksTheShell(t *testing.T) {
	srv, _, alloc := newServer(t, Options{})
	sid := uuid.NewString()
	c := open(t, srv, preamble(sid, alloc, "yes", "backpressure"), true)
	if !c.rep.GetOk() {
		t.Fatalf("refused: %+v", c.rep)
	}
	_ = c.conn.SetReadDeadline(time.Now().Add(waitLimit))
	typ, p, err := termproto.ReadFrame(c.conn, nil)
	if err != nil || typ != termproto.FrameControl || !bytes.Contains(p, []byte(`"ready"`)) {
		t.Fatalf("first frame %d %q %v, want ready", typ, p, err)
	}
	sess := srv.session(sid)

	// Nobody reads the stream now. The output the shell keeps writing piles up in the
	// kernel's terminal buffer, not in the agent.
	waitFor(t, "output to wait in the terminal", func() bool {
		n, err := pendingOutput(sess.master)
		return err == nil && n > 0
	})
	waitFor(t, "yes to block writing", func() bool { return procState(t, sess.cmd.Process.Pid) == 'S' })
	if got := sess.readBytes.Load(); got > termproto.MaxPayload {
		t.Fatalf("the agent took %d bytes from a terminal nobody reads, want at most one read (%d)", got, termproto.MaxPayload)
	}
	assertBounded(t, sess)

	// Reading resumes: output flows again, as whole lines, with the invariant holding.
	var out bytes.Buffer
	for out.Len() < 4<<20 {
		_ = c.conn.SetReadDeadline(time.Now().Add(waitLimit))
		typ, p, err := termproto.ReadFrame(c.conn, nil)
		if err != nil {
			t.Fatalf("read after resuming: %v", err)
		}
		if typ != termproto.FrameData {
			t.Fatalf("unexpected control %q", p)
		}
		out.Write(p)
		assertBounded(t, sess)
	}
	if got := sess.readBytes.Load(); got <= termproto.MaxPayload {
		t.Fatalf("only %d bytes read after resuming", got)
	}
	lines := strings.Split(out.String(), "\r\n")
	for _, l := range lines[1 : len(lines)-1] { // the first and last may be cut
		if l != "backpressure" {
			t.Fatalf("output corrupted: line %q", l)
		}
	}
}

func assertBounded(t *testing.T, sess *session) {
	t.Helper()
	read, handled := sess.readBytes.Load(), sess.handledBytes.Load()
	if inFlight := read - handled; inFlight < 0 || inFlight > termproto.MaxPayload {
		t.Fatalf("%d bytes in flight inside the agent (read %d, handled %d), want at most %d", inFlight, read, handled, termproto.MaxPayload)
	}
	sess.mu.Lock()
	n := sess.ring.Len()
	sess.mu.Unlock()
	if n > ReplayBytes {
		t.Fatalf("ring holds %d bytes", n)
	}
}

// procState is the state letter of /proc/<pid>/stat (S: sleeping, here: blocked).
func procState(t *testing.T, pid int) byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatalf("read process state: %v", err)
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		t.Fatalf("odd /proc stat %q", b)
	}
	return b[i+2]
}
