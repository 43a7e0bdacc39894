package terminal_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/coder/websocket"

	"github.com/gantry-gpu/gantry/controlplane/internal/terminal"
	nodeterm "github.com/gantry-gpu/gantry/nodeagent/terminal"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// The whole path with a real PTY: mint, WebSocket, session_ready, a command's output,
// a resize that `stty size` sees, the shell's exit code, and the session's start and end
// in the database and the audit log (never what was typed).
func TestTerminalHappyPath(t *testing.T) {
	w := newWorld(t)
	runFabric(t, w.App)
	node := w.agentNode(t, w.App, fabricnet.ModeTCP, nodeterm.Options{})
	a := w.activeAllocation(t, node.id, node)

	ts := w.mustMint(t, a.ID, api.TerminalSessionCreateRequest{Cols: ptr(90), Rows: ptr(30)})
	if ts.Reattach || ts.WebsocketPath != "/ws/terminal/"+a.ID.String() || len(ts.Subprotocols) != 2 ||
		ts.Subprotocols[0] != terminal.Subprotocol || ts.Subprotocols[1] != terminal.TokenSubprotocolPrefix+ts.Token || len(ts.Token) != 43 {
		t.Fatalf("minted %+v", ts)
	}
	// Stored hashed only.
	if n := w.count(t, `SELECT count(*) FROM terminal_tokens WHERE token_hash = sha256(convert_to($1, 'UTF8')) AND session_id = $2`, ts.Token, ts.SessionID); n != 1 {
		t.Fatalf("token rows by hash: %d", n)
	}
	if n := w.count(t, `SELECT count(*) FROM terminal_tokens WHERE position(convert_to($1, 'UTF8') in token_hash) > 0`, ts.Token); n != 0 {
		t.Fatal("the token is stored in clear")
	}

	tm := w.dial(t, a.ID, ts.Token)
	if got := tm.ws.Subprotocol(); got != terminal.Subprotocol {
		t.Fatalf("server chose subprotocol %q, want only %q", got, terminal.Subprotocol)
	}
	ready := tm.waitControl("session_ready")
	if ready["session_id"] != ts.SessionID.String() || ready["cols"] != float64(90) || ready["rows"] != float64(30) || ready["replayed"] != false {
		t.Fatalf("session_ready = %v", ready)
	}
	tm.send("echo hello-$((6*7))\r")
	tm.waitOutput("hello-42")
	tm.send("stty size\r")
	tm.waitOutput("30 90")
	tm.control(map[string]any{"type": "resize", "cols": 132, "rows": 41})
	tm.send("stty size\r")
	tm.waitOutput("41 132")
	tm.control(map[string]any{"type": "ping"})
	tm.waitControl("pong")

	if n := w.count(t, `SELECT count(*) FROM terminal_sessions WHERE id = $1 AND status = 'attached' AND user_id = $2 AND node_id = $3`,
		ts.SessionID, w.Acme.AdminID, node.id); n != 1 {
		t.Fatalf("attached session rows: %d", n)
	}
	tm.send("exit 3\r")
	exit := tm.waitControl("exit")
	if exit["code"] != float64(3) {
		t.Fatalf("exit = %v", exit)
	}
	if err := tm.waitClosed(); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Fatalf("close after exit: %v", err)
	}
	eventually(t, "the session ended", func() bool {
		return w.count(t, `SELECT count(*) FROM terminal_sessions WHERE id = $1 AND status = 'ended' AND ended_by = 'exit' AND exit_code = 3`, ts.SessionID) == 1
	})
	var meta []byte
	if err := w.Pool.QueryRow(context.Background(), `SELECT metadata FROM audit_events WHERE action = 'terminal.session.end' AND target_id = $1 AND actor_user_id = $2`,
		ts.SessionID.String(), w.Acme.AdminID).Scan(&meta); err != nil {
		t.Fatalf("end audit row: %v", err)
	}
	var m map[string]any
	_ = json.Unmarshal(meta, &m)
	if m["ended_by"] != "exit" || m["exit_code"] != float64(3) || m["allocation_id"] != a.ID.String() || m["user_id"] != w.Acme.AdminID.String() || m["duration_seconds"] == nil {
		t.Fatalf("end audit metadata = %v", m)
	}
	if n := w.count(t, `SELECT count(*) FROM audit_events WHERE action = 'terminal.session.start' AND target_id = $1`, ts.SessionID.String()); n != 1 {
		t.Fatalf("start audit rows: %d", n)
	}
	// Nothing typed or printed reaches the audit log.
	if n := w.count(t, `SELECT count(*) FROM audit_events WHERE metadata::text LIKE '%hello%' OR metadata::text LIKE '%stty%'`); n != 0 {
		t.Fatal("terminal content in the audit log")
	}
	if ok, replay := counters(t, w.App); ok != 1 || replay != 0 {
		t.Fatalf("counters ok=%v replay=%v", ok, replay)
	}
}
