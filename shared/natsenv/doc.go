// Package natsenv owns embedded NATS servers and the probing of existing ones.
//
// Embedded runs an in-process nats-server with JetStream on a free 127.0.0.1
// port, storing streams under a given directory; make dev uses it when NATS_URL
// is not set and shared/testenv when no local server answers. Reachable and
// HasJetStream answer quickly whether a server at a URL can be used.
package natsenv
