package terminal

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/termproto"
)

// closeWait bounds waiting for the agent's exit after asking it to end a session, and
// the final control frame toward a stream nobody reads.
const closeWait = 3 * time.Second

// causeKind is why a bridge stops; the first cause wins.
type causeKind int

const (
	causeExit         causeKind = iota + 1 // the agent: the shell exited
	causeAgentError                        // the agent: an error control frame
	causeStreamLost                        // the stream ended without an exit (tunnel, agent, relay)
	causeClientClosed                      // the browser closed normally (1000): end the session
	causeClientGone                        // the browser went away, or stopped reading: detach
	causeEnded                             // the allocation stopped running: end the session
	causeShutdown                          // this replica is stopping: detach
	causeRefused                           // the attach could not be recorded (session gone, database)
	causeReplaced                          // another WebSocket took the session over
)

type cause struct {
	kind      causeKind
	code      *int      // causeExit
	agentWhy  string    // causeExit: the agent's reason (termproto exit message)
	reason    EndReason // causeEnded
	agentCode string    // causeAgentError
	err       error     // causeRefused
}

// bridge joins one browser WebSocket to one terminal stream (termproto). Each
// direction is one goroutine that reads the next message only once the previous one
// was written on: no input is dropped, and output toward a slow browser waits (the
// stream's flow-control window then stops the agent reading the PTY) instead of
// queueing. Nothing but frame boundaries is looked at in data: keystrokes and output
// are never logged or stored.
type bridge struct {
	s     *Service
	ctx   context.Context // carries the principal, correlation id and trace
	req   *http.Request   // for error envelopes (its context values only)
	ws    *websocket.Conn
	st    net.Conn
	grant Grant
	alloc Allocation

	stMu   sync.Mutex   // frames toward the agent come from the client loop and from finish
	causes chan cause   // first one stops the bridge; later ones are read while ending
	att    atomic.Int32 // attachment number once the agent said ready (0 before)
	// wsClosed: a write found the browser's WebSocket closed; later output is dropped
	// and fromClient's Read gives the cause (write).
	wsClosed atomic.Bool

	// Terminal flow control (shared/termproto flow.go), when Config.OutputWindow is on:
	// in is the agent's window for input, counted from the bridge's flow frame and
	// limited once the agent answers; outDebt, set by that answer (fromAgent's goroutine
	// only), is the output handed to the browser and not yet acknowledged.
	in      termproto.Credit
	outDebt *termproto.Debt
}

func newBridge(s *Service, ctx context.Context, r *http.Request, ws *websocket.Conn, st net.Conn, g Grant, a Allocation) *bridge {
	return &bridge{s: s, ctx: ctx, req: r, ws: ws, st: st, grant: g, alloc: a, causes: make(chan cause, 16)}
}

// stop asks the bridge to stop for c (non-blocking; safe from any goroutine).
func (b *bridge) stop(c cause) {
	select {
	case b.causes <- c:
	default:
	}
}

// run bridges until a cause stops it, ends or detaches the session accordingly and
// closes both sides.
func (b *bridge) run() {
	ctx, cancel := context.WithCancel(b.ctx)
	if w := b.s.cfg.OutputWindow; w > 0 {
		// The first frame toward the agent: an agent without flow control ignores it.
		b.in.Count()
		if err := b.toAgent(func() error {
			return termproto.WriteControl(b.st, termproto.Control{Type: termproto.TypeFlow, Window: w})
		}); err != nil {
			b.stop(cause{kind: causeStreamLost})
		}
	}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); b.fromAgent(ctx) }()
	go func() { defer wg.Done(); b.fromClient(ctx) }()
	go func() { defer wg.Done(); b.ping(ctx) }()
	first := <-b.causes
	b.finish(ctx, first)
	cancel()
	b.in.Close()
	_ = b.st.Close()
	_ = b.ws.CloseNow()
	wg.Wait()
}

// refuse answers a WebSocket that cannot be bridged with an error frame and closes it.
func (b *bridge) refuse(err error) {
	abandon(b.st, b.grant.Reattach)
	b.sendError(context.Background(), err)
	_ = b.ws.Close(websocket.StatusTryAgainLater, "not available")
}

func (b *bridge) fromAgent(ctx context.Context) {
	buf := make([]byte, termproto.MaxPayload)
	for {
		typ, p, err := termproto.ReadFrame(b.st, buf)
		if err != nil {
			b.stop(cause{kind: causeStreamLost})
			return
		}
		switch typ {
		case termproto.FrameData:
			if !b.write(ctx, websocket.MessageBinary, p) {
				return
			}
			// Output dropped on a closed WebSocket counts as consumed too, so that the
			// agent's pump is not held on a window that never comes back while it ends.
			if b.outDebt != nil {
				if n := b.outDebt.Consumed(len(p)); n > 0 {
					if err := b.toAgent(func() error { return termproto.WriteWindow(b.st, n) }); err != nil {
						b.stop(cause{kind: causeStreamLost})
						return
					}
				}
			}
			continue
		case termproto.FrameWindow:
			if err := b.in.AckFrame(p); err != nil {
				b.stop(cause{kind: causeAgentError, agentCode: "protocol_error"})
				return
			}
			continue
		}
		ctl, err := termproto.ParseControl(p)
		if err != nil {
			b.stop(cause{kind: causeAgentError, agentCode: "protocol_error"})
			return
		}
		switch ctl.Type {
		case termproto.TypeReady:
			if !b.ready(ctx, ctl) {
				return
			}
		case termproto.TypeFlow:
			// The agent's answer to the bridge's flow frame: its output from here on
			// counts against OutputWindow, and input is limited to the agent's window.
			if b.s.cfg.OutputWindow <= 0 || b.outDebt != nil || !termproto.ValidWindow(ctl.Window) {
				b.stop(cause{kind: causeAgentError, agentCode: "protocol_error"})
				return
			}
			b.outDebt = termproto.NewDebt(b.s.cfg.OutputWindow)
			b.in.Limit(ctl.Window)
		case termproto.TypeExit:
			b.stop(cause{kind: causeExit, code: ctl.Code, agentWhy: ctl.Message})
			return
		case termproto.TypeError:
			if ctl.ErrorCode == agentSessionReplaced {
				b.stop(cause{kind: causeReplaced})
				return
			}
			b.stop(cause{kind: causeAgentError, agentCode: ctl.ErrorCode})
			return
		}
	}
}

// ready records the attachment (creating the session on its first one) and tells the
// browser; false when the bridge must stop.
func (b *bridge) ready(ctx context.Context, ctl termproto.Control) bool {
	cols, rows := int(ctl.Cols), int(ctl.Rows)
	if cols == 0 || rows == 0 {
		cols, rows = b.grant.Cols, b.grant.Rows
	}
	att, err := b.s.attach(ctx, b.grant, b.alloc.NodeID, cols, rows)
	if err != nil {
		b.stop(cause{kind: causeRefused, err: err})
		return false
	}
	b.att.Store(att)
	return b.write(ctx, websocket.MessageText, marshal(readyFrame{
		Type: frameSessionReady, SessionID: b.grant.SessionID.String(), Cols: cols, Rows: rows, Replayed: ctl.Replayed,
	}))
}

// write sends one message to the browser within the write timeout; false when the
// bridge must stop (it detaches: the browser is gone or does not read). On a WebSocket
// already closed (net.ErrClosed) the message is dropped and the bridge goes on:
// fromClient's Read fails too and gives the cause, which matters for a browser that
// closed normally while output was under way. The library closes the connection as it
// answers the close frame, before Read returns the status, so output written in
// between failed here first and turned "the user closed the terminal" into a detach
// (seen as a flaky end-to-end test under load). Reading from the agent goes on too,
// for its exit, which a normal close waits for.
func (b *bridge) write(ctx context.Context, typ websocket.MessageType, p []byte) bool {
	if b.wsClosed.Load() {
		return true
	}
	wctx, cancel := context.WithTimeout(ctx, b.s.cfg.WriteTimeout)
	err := b.ws.Write(wctx, typ, p)
	cancel()
	switch {
	case err == nil:
	case errors.Is(err, net.ErrClosed):
		b.wsClosed.Store(true)
	default:
		b.stop(cause{kind: causeClientGone})
		return false
	}
	return true
}

func (b *bridge) fromClient(ctx context.Context) {
	for {
		typ, p, err := b.ws.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) == websocket.StatusNormalClosure {
				b.stop(cause{kind: causeClientClosed})
			} else {
				b.stop(cause{kind: causeClientGone})
			}
			return
		}
		if typ == websocket.MessageBinary {
			if err := b.input(ctx, p); err != nil {
				b.stop(cause{kind: causeStreamLost})
				return
			}
			continue
		}
		if !b.control(ctx, p) {
			return
		}
	}
}

// control handles one text frame from the browser; a bad one is answered with an error
// frame and the session goes on.
func (b *bridge) control(ctx context.Context, p []byte) bool {
	f, err := parseClientFrame(p)
	if err != nil {
		b.sendError(ctx, err)
		return true
	}
	switch f.Type {
	case frameResize:
		err := b.toAgent(func() error {
			return termproto.WriteControl(b.st, termproto.Control{Type: termproto.TypeResize, Cols: uint16(f.Cols), Rows: uint16(f.Rows)})
		})
		if err != nil {
			b.stop(cause{kind: causeStreamLost})
			return false
		}
	case framePing:
		return b.write(ctx, websocket.MessageText, marshal(pongFrame{Type: framePong}))
	}
	return true
}

// input writes keystrokes to the agent as data frames, each within the agent's input
// window once flow control is on (waiting, without holding stMu, for its window frames).
func (b *bridge) input(ctx context.Context, p []byte) error {
	return b.in.WriteData(&b.stMu, b.st, p, ctx.Done())
}

func (b *bridge) toAgent(f func() error) error {
	b.stMu.Lock()
	defer b.stMu.Unlock()
	return f()
}

// ping keeps idle terminals alive through load balancers; an unanswered ping detaches.
func (b *bridge) ping(ctx context.Context) {
	t := time.NewTicker(b.s.cfg.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			pctx, cancel := context.WithTimeout(ctx, b.s.cfg.PingInterval)
			err := b.ws.Ping(pctx)
			cancel()
			if err != nil {
				// A closed WebSocket is fromClient's to report (write).
				if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
					b.stop(cause{kind: causeClientGone})
				}
				return
			}
		}
	}
}

// finish acts on the first cause: tell the other side, and end or detach the session.
func (b *bridge) finish(ctx context.Context, c cause) {
	att := b.att.Load()
	switch c.kind {
	case causeExit:
		reason, code := exitReason(c.agentWhy), c.code
		if reason != EndExit {
			code = nil // the agent ended the shell: it has no exit status of its own
		}
		b.sendJSON(ctx, exitFrame{Type: frameExit, Code: code, Reason: reasonText(reason)})
		b.end(ctx, att, reason, code)
		_ = b.ws.Close(websocket.StatusNormalClosure, "exit")
	case causeReplaced:
		// The newer attachment owns the session now: nothing to record here.
		b.sendError(ctx, apierr.New(apierr.InvalidRequest, "another terminal attached to this session").
			With("reason", "session_replaced").WithStatus(http.StatusConflict))
		_ = b.ws.Close(websocket.StatusPolicyViolation, "session replaced")
	case causeAgentError:
		b.sendError(ctx, apierr.New(apierr.UpstreamError, "the node ended the terminal with an error").With("agent_error_code", c.agentCode))
		b.end(ctx, att, EndError, nil)
		_ = b.ws.Close(websocket.StatusInternalError, "node error")
	case causeStreamLost:
		b.sendError(ctx, apierr.New(apierr.UpstreamError, "the connection to the node was lost; reattach to continue").With("reason", "stream_lost"))
		b.detach(ctx, att)
		_ = b.ws.Close(websocket.StatusInternalError, "node connection lost")
	case causeClientClosed:
		code := b.askToEnd(termproto.TypeClose)
		b.end(ctx, att, EndClientClosed, code)
	case causeClientGone:
		b.tellAgent(termproto.TypeDetach)
		b.detach(ctx, att)
	case causeEnded:
		code := b.askToEnd(termproto.TypeClose)
		b.sendJSON(ctx, exitFrame{Type: frameExit, Code: code, Reason: string(c.reason)})
		b.end(ctx, att, c.reason, code)
		_ = b.ws.Close(websocket.StatusNormalClosure, "allocation no longer running")
	case causeShutdown:
		b.tellAgent(termproto.TypeDetach)
		b.detach(ctx, att)
		_ = b.ws.Close(websocket.StatusServiceRestart, "control plane restarting; reattach")
	case causeRefused:
		err := c.err
		gone := errors.Is(err, errSessionGone)
		if gone {
			err = sessionGoneError()
		}
		if gone || !b.grant.Reattach {
			// Unrecorded, the PTY the agent just gave us is nobody's.
			b.tellAgent(termproto.TypeClose)
		} else {
			b.tellAgent(termproto.TypeDetach) // the recorded session stays reattachable
		}
		b.sendError(ctx, err)
		_ = b.ws.Close(websocket.StatusInternalError, "session not recorded")
	}
}

// agentSessionReplaced is the agent's error code when another stream took the session.
const agentSessionReplaced = "session_replaced"

// exitReason maps the agent's exit reason (nodeagent/terminal) onto ours.
func exitReason(agentWhy string) EndReason {
	switch agentWhy {
	case "closed":
		return EndClientClosed
	case "allocation_released":
		return EndReleased
	case "idle_timeout":
		return EndIdleTimeout
	case "agent_shutdown":
		return EndAgentShutdown
	}
	return EndExit // "exited", or an agent that gives no reason
}

func reasonText(r EndReason) string {
	if r == EndExit {
		return ""
	}
	return string(r)
}

// askToEnd sends the agent a control frame that ends the session and waits (bounded)
// for its exit, returning the exit code when one came.
func (b *bridge) askToEnd(typ string) *int {
	if b.tellAgent(typ) != nil {
		return nil
	}
	t := time.NewTimer(closeWait)
	defer t.Stop()
	for {
		select {
		case c := <-b.causes:
			switch c.kind {
			case causeExit:
				if exitReason(c.agentWhy) != EndExit {
					return nil
				}
				return c.code
			case causeStreamLost, causeAgentError:
				return nil
			}
		case <-t.C:
			return nil
		}
	}
}

// tellAgent writes one control frame toward the agent, bounded in time. The deadline
// is set before taking the lock: it also frees an input write stuck on an agent that
// reads nothing, which holds the lock.
func (b *bridge) tellAgent(typ string) error {
	_ = b.st.SetWriteDeadline(time.Now().Add(closeWait))
	return b.toAgent(func() error {
		return termproto.WriteControl(b.st, termproto.Control{Type: typ, SessionID: b.grant.SessionID.String()})
	})
}

func (b *bridge) end(ctx context.Context, att int32, reason EndReason, code *int) {
	if att == 0 {
		return // never attached: there is no session to end
	}
	if _, err := b.s.End(context.WithoutCancel(ctx), b.grant.SessionID, att, reason, code); err != nil {
		b.s.deps.Log.ErrorContext(ctx, "terminal: recording the session end failed", "session_id", b.grant.SessionID, "err", err)
	}
}

func (b *bridge) detach(ctx context.Context, att int32) {
	if att == 0 {
		return
	}
	if err := b.s.detach(context.WithoutCancel(ctx), b.grant.SessionID, att); err != nil {
		b.s.deps.Log.ErrorContext(ctx, "terminal: recording the detach failed", "session_id", b.grant.SessionID, "err", err)
	}
}

func (b *bridge) sendJSON(ctx context.Context, v any) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.s.cfg.WriteTimeout)
	defer cancel()
	_ = b.ws.Write(wctx, websocket.MessageText, marshal(v))
}

// sendError sends an error frame: the contract's envelope, with the route and method.
func (b *bridge) sendError(ctx context.Context, err error) {
	_, env := envelopes.Envelope(b.req, withRoute(err, RouteTerminal, http.MethodGet))
	if apierr.CodeOf(err) == apierr.InternalError {
		b.s.deps.Log.ErrorContext(ctx, "terminal: session failed", "session_id", b.grant.SessionID, "err", err)
	}
	b.sendJSON(ctx, errorFrame{Type: frameError, Error: env})
}
