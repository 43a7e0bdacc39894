// Package provisioning is the provisioning dispatcher: it delivers allocation tasks
// (shared/alloctask) to node agents. The outbox relay publishes every task the
// allocations feature records onto the PROVISIONING JetStream stream; a durable pull
// consumer, shared by every control-plane replica, hands each message to one replica,
// which loads the task, sends it through the node fabric (to whichever replica holds the
// node's tunnel) and acknowledges the message only once the agent has acknowledged the
// task. A node that cannot be reached is retried with jittered exponential backoff until
// the task's deadline (its creation + GANTRY_PROVISIONING_TIMEOUT); then the allocation
// fails through its lifecycle. docs/provisioning.md is the operator's view.
//
// The package owns the transport only: the stream, the consumer, retries, metrics. Every
// decision about an allocation (is the task still wanted, what a refusal or a timeout
// does to it) is the allocations feature's, through allocations.Service; this package
// never writes a table.
package provisioning
