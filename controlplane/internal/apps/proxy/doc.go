// Package proxy is the app proxy (docs/app-proxy.md): ANY /api/v1/app-proxy/{app_instance_id}/*
// carries a user's HTTP requests and WebSockets through the control plane and the node
// fabric to the port an app instance serves on its node. It owns the proxy's
// authentication (a bearer token, or the instance's path-scoped cookie set by a
// single-use exchange), its authorization (members of the instance's project, and what
// the Grants hook admits), the header hygiene (hop-by-hop headers, the user's
// Authorization and Gantry's cookies never reach the app) and the mapping of an
// instance that cannot be reached onto clear 502/503 envelopes.
//
// It never buffers a body whole, never opens a connection to a node (streams go
// through the terminal service's stream opener, which relays to the replica holding
// the node's tunnel), and never decides an instance's state: the instances service
// (Instances) does.
package proxy
