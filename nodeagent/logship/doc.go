// Package logship is the node agent's log shipper (ARCHITECTURE §6). It collects the
// agent's own log records, the output of its tasks (provision, release, runtime) and,
// optionally, chosen journald units; batches them in the Loki push format (protobuf in
// a snappy block) by size (1 MiB) or time (1 s); and pushes each batch to the log gateway
// with the node bearer token.
//
// Sealed batches go to a bounded spool (a directory, or memory when none is configured)
// before they are pushed, and leave it only when the gateway accepted them or refused them
// for good, so a gateway outage of minutes loses nothing younger than 10 minutes. Events
// older than that are dropped before a push and counted. Failed pushes are retried with
// jittered exponential backoff from 500 ms up to minutes, honouring Retry-After.
//
// It must never block the agent's real work: adding a line is a non-blocking send into
// a bounded queue, and a line that does not fit is dropped and counted.
package logship
