// Package terminal owns the browser terminal on the control-plane side (docs/terminal.md):
// the single-use tokens that open it, the WebSocket at /ws/terminal/{allocation_id}, the
// bridge between that WebSocket and a raw terminal stream to the node agent over the
// fabric (termproto), the authenticated hop to the replica that holds the node's tunnel
// when the WebSocket lands elsewhere, and the terminal session records and their audit
// rows.
//
// It never stores, logs or audits what is typed or printed: keystrokes and output only
// ever pass through. Tokens are stored only as their SHA-256 and never appear in logs,
// URLs or error messages. The PTY itself is the agent's (nodeagent/terminal).
package terminal
