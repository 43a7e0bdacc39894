package terminal_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/terminal"
	nodeterm "github.com/gantry-gpu/gantry/nodeagent/terminal"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// A megabyte pasted in 64 KiB messages reaches the shell whole: input is written to the
// stream before the next message is read, and nothing is dropped on the way. Then 4 MiB
// of output reaches the browser whole. Both with the terminal's flow control (its
// windows are far smaller than either) and without it.
func TestInputIsNeverDropped(t *testing.T) {
	for name, window := range map[string]int{"flow-control": 0, "stream-windows-only": -1} {
		t.Run(name, func(t *testing.T) {
			w := newWorld(t, apitest.WithConfig(func(c *app.Config) { c.Terminal.OutputWindow = window }))
			runFabric(t, w.App)
			node := w.agentNode(t, w.App, fabricnet.ModeTCP, nodeterm.Options{})
			a := w.activeAllocation(t, node.id, node)
			tm := w.dial(t, a.ID, w.mustMint(t, a.ID, api.TerminalSessionCreateRequest{}).Token)
			tm.waitControl("session_ready")
			// Raw mode: the line discipline passes every byte (a canonical line stops at 4 KiB).
			tm.send("stty raw -echo; echo RE$((0))ADY; head -c 1048576 | wc -c; stty sane; echo SA$((0))NE\r")
			tm.waitOutput("RE0ADY")
			chunk := bytes.Repeat([]byte("y"), 64<<10)
			for i := 0; i < 16; i++ {
				tm.send(string(chunk))
			}
			tm.waitOutput("1048576")
			tm.waitOutput("SA0NE") // the terminal is back in canonical mode for the next line

			// \132 is Z: the command line's echo has none.
			tm.send("head -c 4194304 /dev/zero | tr '\\0' '\\132'; echo; echo DO$((0))NE\r")
			tm.waitOutput("DO0NE")
			if n := strings.Count(tm.output(), "Z"); n != 4<<20 {
				t.Fatalf("%d bytes of output arrived, want %d", n, 4<<20)
			}
		})
	}
}

// A browser that stops reading is detached after the write timeout instead of having
// output queued for it; the session survives on the node and can be reattached.
func TestSlowBrowserIsDetached(t *testing.T) {
	w := newWorld(t, apitest.WithConfig(func(c *app.Config) { c.Terminal.WriteTimeout = 500 * time.Millisecond }))
	runFabric(t, w.App)
	node := w.agentNode(t, w.App, fabricnet.ModeTCP, nodeterm.Options{})
	a := w.activeAllocation(t, node.id, node)
	ts := w.mustMint(t, a.ID, api.TerminalSessionCreateRequest{})

	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, wsURL(w.Server.URL)+"/ws/terminal/"+a.ID.String(), &websocket.DialOptions{
		Subprotocols: []string{terminal.Subprotocol, terminal.TokenSubprotocolPrefix + ts.Token},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	for {
		typ, p, err := ws.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if typ == websocket.MessageText && strings.Contains(string(p), "session_ready") {
			break
		}
	}
	// An endless flood, and a browser that reads nothing more.
	if err := ws.Write(ctx, websocket.MessageBinary, []byte("yes flood-line\r")); err != nil {
		t.Fatal(err)
	}
	w.waitSession(t, ts.SessionID, "detached", "")
	if node.term.Len() != 1 {
		t.Fatal("the session did not survive the detach")
	}
	// Reattaching replays the tail of the flood; stop it.
	re := w.mustMint(t, a.ID, api.TerminalSessionCreateRequest{SessionID: &ts.SessionID})
	tm := w.dial(t, a.ID, re.Token)
	if ready := tm.waitControl("session_ready"); ready["replayed"] != true {
		t.Fatalf("session_ready = %v", ready)
	}
	tm.waitOutput("flood-line")
	tm.send("\x03")
	tm.send("echo after-$((3*3))\r")
	tm.waitOutput("after-9")
}

// The benchmark client works end to end (its figures are gantry-bench's to print).
func TestBenchClient(t *testing.T) {
	w := newWorld(t)
	runFabric(t, w.App)
	node := w.agentNode(t, w.App, fabricnet.ModeTCP, nodeterm.Options{})
	a := w.activeAllocation(t, node.id, node)
	ts := w.mustMint(t, a.ID, api.TerminalSessionCreateRequest{})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	c, err := terminal.DialBench(ctx, w.Server.URL, a.ID, ts.Token, http.Header{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.SessionID != ts.SessionID.String() {
		t.Fatalf("session %s", c.SessionID)
	}
	rtts, err := c.EchoRoundTrips(ctx, 150)
	if err != nil || len(rtts) != 150 {
		t.Fatalf("echo: %d %v", len(rtts), err)
	}
	n, _, err := c.Throughput(ctx, "head -c 300000 /dev/zero | tr '\\0' x")
	if err != nil || n < 300000 {
		t.Fatalf("throughput: %d bytes, %v", n, err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	w.waitSession(t, ts.SessionID, "ended", "client_closed")
}
