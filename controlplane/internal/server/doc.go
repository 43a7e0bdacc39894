// Package server composes the control plane's HTTP surface: it mounts the request chain
// of ARCHITECTURE §3 in order (recover, correlation id, tracing, metrics, rate limit,
// authentication, project context, request validation, idempotency), routes the
// generated strict server, and owns the one error mapper every failure leaves through.
// It owns no feature logic: feature packages implement their slice of the generated
// interface and server only composes them.
package server
