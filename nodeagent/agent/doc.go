// Package agent is the node agent's run loop: it dials the control plane's fabric
// (QUIC first, TLS+yamux where UDP is blocked), authenticates with the node token, says
// Hello with the GPU inventory, and then for as long as the tunnel lives sends
// heartbeats at the interval the control plane chose, telemetry samples on their
// interval, and the inventory again whenever it changes; it runs dispatched tasks
// through a tasks.Executor (each task id once) and serves the raw streams the control
// plane opens. When the tunnel ends it reconnects with jittered exponential backoff
// (Backoff, 500 ms doubling to 30 s by default), and on context cancellation (SIGTERM)
// it closes the tunnel with a reason and returns.
//
// The package is importable (not internal) so end-to-end tests can run a real agent
// in-process against a real control plane. It never listens on a network port: every
// connection is dialled out.
package agent
