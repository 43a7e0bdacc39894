package terminal

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"
)

// BenchClient is the browser's side of a terminal WebSocket, for benchmarks
// (controlplane/cmd/gantry-bench): keystroke echo round trips and output throughput
// through the whole path (WebSocket -> control plane -> [replica hop] -> tunnel ->
// agent PTY -> back). One goroutine per client.
type BenchClient struct {
	ws  *websocket.Conn
	buf bytes.Buffer
	// SessionID and Replayed are from the server's session_ready.
	SessionID string
	Replayed  bool
}

// DialBench opens the terminal WebSocket of allocationID at baseURL ("http://host:port")
// with a minted token and waits for session_ready. header may carry an Origin.
func DialBench(ctx context.Context, baseURL string, allocationID uuid.UUID, token string, header http.Header) (*BenchClient, error) {
	u := "ws" + strings.TrimPrefix(strings.TrimRight(baseURL, "/"), "http") + "/ws/terminal/" + allocationID.String()
	ws, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{
		HTTPHeader: header, Subprotocols: []string{Subprotocol, TokenSubprotocolPrefix + token},
	})
	if err != nil {
		if resp != nil && resp.Body != nil {
			b, _ := io.ReadAll(resp.Body)
			return nil, fmt.Errorf("terminal websocket: %w: %s", err, b)
		}
		return nil, fmt.Errorf("terminal websocket: %w", err)
	}
	ws.SetReadLimit(1 << 20)
	c := &BenchClient{ws: ws}
	for {
		typ, p, err := ws.Read(ctx)
		if err != nil {
			_ = ws.CloseNow()
			return nil, fmt.Errorf("waiting for session_ready: %w", err)
		}
		if typ != websocket.MessageText {
			continue
		}
		var f readyFrame
		if json.Unmarshal(p, &f) == nil && f.Type == frameSessionReady {
			c.SessionID, c.Replayed = f.SessionID, f.Replayed
			return c, nil
		}
		if strings.Contains(string(p), `"type":"error"`) {
			_ = ws.CloseNow()
			return nil, fmt.Errorf("terminal refused: %s", p)
		}
	}
}

// EchoRoundTrips types n single letters, one at a time, and measures each until its
// echo comes back (the PTY's line discipline or the shell's line editor echoes it).
// The line is cleared (Ctrl-U) every 100 keystrokes.
func (c *BenchClient) EchoRoundTrips(ctx context.Context, n int) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		if i > 0 && i%100 == 0 {
			if err := c.ws.Write(ctx, websocket.MessageBinary, []byte{0x15}); err != nil {
				return out, err
			}
		}
		k := byte('a' + i%26)
		start := time.Now()
		if err := c.ws.Write(ctx, websocket.MessageBinary, []byte{k}); err != nil {
			return out, err
		}
		if err := c.readUntil(ctx, func(p []byte) bool { return bytes.IndexByte(p, k) >= 0 }); err != nil {
			return out, err
		}
		out = append(out, time.Since(start))
	}
	_ = c.ws.Write(ctx, websocket.MessageBinary, []byte{0x15})
	return out, nil
}

// Throughput runs command in the shell and counts the output bytes until it finished
// (a marker echoed after it, which never appears in the echoed command line itself).
// cat of a large file, or `head -c 104857600 /dev/zero | tr '\0' x`, are typical.
func (c *BenchClient) Throughput(ctx context.Context, command string) (bytesRead int64, elapsed time.Duration, err error) {
	return c.PacedThroughput(ctx, command, 0)
}

// PacedThroughput is Throughput for a reader that consumes at most bytesPerSecond (0:
// as fast as it can), like a browser whose terminal renders at its own speed: the
// backpressure reaches the shell through the control plane and the tunnel.
func (c *BenchClient) PacedThroughput(ctx context.Context, command string, bytesPerSecond int64) (bytesRead int64, elapsed time.Duration, err error) {
	const marker = "__GANTRY_BENCH_42__"
	line := command + "; echo __GANTRY_BENCH_$((40+2))__\r"
	start := time.Now()
	if err := c.ws.Write(ctx, websocket.MessageBinary, []byte(line)); err != nil {
		return 0, 0, err
	}
	// The marker may straddle two messages: keep the previous message's last bytes.
	m := []byte(marker)
	tail := make([]byte, 0, 2*len(m))
	err = c.readUntil(ctx, func(p []byte) bool {
		bytesRead += int64(len(p))
		if bytesPerSecond > 0 {
			due := start.Add(time.Duration(float64(bytesRead) / float64(bytesPerSecond) * float64(time.Second)))
			if wait := time.Until(due); wait > 0 {
				time.Sleep(wait)
			}
		}
		keep := len(m) - 1
		found := bytes.Contains(p, m) || bytes.Contains(append(tail, p[:min(len(p), keep)]...), m)
		tail = append(tail, p[max(0, len(p)-keep):]...)
		tail = append(tail[:0], tail[max(0, len(tail)-keep):]...)
		return found
	})
	return bytesRead, time.Since(start), err
}

// readUntil reads binary messages until done says so; an exit or error frame ends it.
// Messages are read into one reused buffer, as a browser's terminal would consume them,
// so that the client's own garbage does not weigh on a machine it shares with the path
// it measures.
func (c *BenchClient) readUntil(ctx context.Context, done func([]byte) bool) error {
	for {
		typ, r, err := c.ws.Reader(ctx)
		if err != nil {
			return err
		}
		c.buf.Reset()
		if _, err := c.buf.ReadFrom(r); err != nil {
			return err
		}
		p := c.buf.Bytes()
		if typ == websocket.MessageBinary {
			if done(p) {
				return nil
			}
			continue
		}
		var f struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(p, &f) == nil && (f.Type == frameExit || f.Type == frameError) {
			return errors.New("terminal ended: " + string(p))
		}
	}
}

// Interrupt types Ctrl-C (ends the running command, as in any terminal).
func (c *BenchClient) Interrupt(ctx context.Context) error {
	return c.ws.Write(ctx, websocket.MessageBinary, []byte{0x03})
}

// Close ends the session (normal closure: the agent closes the shell).
func (c *BenchClient) Close() error { return c.ws.Close(websocket.StatusNormalClosure, "bench done") }
