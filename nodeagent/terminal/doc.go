// Package terminal is the node agent's end of the browser terminal: it serves the raw
// TERMINAL streams the control plane opens over the node tunnel (agent.StreamHandler),
// starts the allocation's shell on a PTY as the allocation's runtime user with the
// allocation's environment, and bridges the PTY to the stream with the frames of
// shared/termproto.
//
// A session (one PTY, one shell) is named by the stream id of the preamble and outlives
// the stream that started it: when a stream ends without a `close` the session is kept
// for a grace period (Options.DetachedTimeout, 5 minutes by default), and a new stream
// with the same session id and allocation id reattaches to it. A reattach is answered
// with `ready` (replayed=true), a terminal reset ("\x1bc") and the most recent 64 KiB of
// output, then live output. A second stream for a session that is attached replaces the
// first, which gets an `error` control (session_replaced) and is closed.
//
// Backpressure is end to end: the session reads the PTY only as fast as the attached
// stream takes the output (the stream is flow-controlled by yamux / QUIC windows and,
// when the control plane turns it on, by the terminal's own output window), so a slow
// reader blocks the shell instead of growing a buffer. Input is written to the PTY before
// the next frame is read from the stream or, with the terminal's flow control, queued
// within the 64 KiB input window the agent grants; no keystroke is ever dropped. The
// per-session buffers are the 64 KiB replay ring and that input queue.
//
// The package never decides whether an allocation is live: it asks Environments (the
// allocation runtime), and the runtime calls EndAllocation when it stops or releases an
// allocation. It never logs or stores terminal input or output.
package terminal
