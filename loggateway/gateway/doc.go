// Package gateway is the node log gateway: the size-capped, node-token-authenticated front
// door through which node agents push log batches to Loki (ARCHITECTURE §6).
//
// It owns exactly one operation, POST /loki/api/v1/push in Loki's wire formats (protobuf
// in a snappy block, or Loki's JSON form), plus GET /healthz and GET /metrics. For every
// batch it checks the size cap (from Content-Length before reading, and again while
// decompressing), validates the node bearer token through the control plane's
// introspection (cached briefly), stamps the authenticated node_id label on every stream
// (whatever the node claimed), and forwards the batch to Loki, or to a local file in
// development. Every batch ends in one outcome of node_log_gateway_batches_total.
//
// It must never forward a batch whose token was not accepted, never let a node speak for
// another, never allocate by a size the client claims beyond the cap, and never show a
// client Loki's raw error text.
package gateway
