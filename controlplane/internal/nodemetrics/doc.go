// Package nodemetrics serves the node agents' Prometheus metrics to Prometheus. Agents
// listen on no port (a GPU host may sit behind NAT and accepts nothing from the control
// plane), so the control plane scrapes each one through its fabric tunnel: a
// STREAM_KIND_METRICS stream, answered with the text exposition (bounded in size and
// time). A replica that does not hold the node's tunnel asks the holder over NATS
// request-reply. Prometheus finds the online nodes through an HTTP service discovery
// endpoint and scrapes GET /api/v1/internal/metrics/nodes/{node_id}, both authenticated
// with the node metrics token (docs/nodeagent.md, "Metrics"; docs/operations.md).
package nodemetrics
