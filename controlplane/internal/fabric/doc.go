// Package fabric is the control plane's end of the node fabric: the tunnel server that
// every node agent dials (QUIC, or TLS+yamux over TCP, on one port number; see
// shared/fabricnet and proto/fabric/v1), the fabric PKI, node presence and the Go API
// other features use to reach a node.
//
// It owns:
//   - the fabric CA and server certificate (PostgreSQL, keys sealed under the master key);
//   - one live session per node on this replica (a second tunnel from the same node
//     replaces the first, on any replica), and beside a session at most one bulk side
//     session (bulk.go: a TLS+TCP tunnel carrying only the session's raw streams);
//   - presence in a JetStream KV bucket (node -> replica, session, transport, last
//     heartbeat), so any replica can route to any node, and the heartbeat policy: TTLs
//     chosen from the fleet size with jitter and grace, and a long TTL right after a
//     restart so a reconnect storm marks nobody offline;
//   - Dispatch (task -> agent ack, forwarded to the holding replica over NATS) and
//     OpenStream (raw terminal / app-proxy streams, on the holding replica);
//   - Disconnect, which ends a node's tunnel on whichever replica holds it.
//
// It never decides who a node is or what it may do: node tokens, node records and
// their status columns belong to package nodes, reached through fleet.Directory, which
// it calls only when something changed (a heartbeat is not a change).
package fabric
