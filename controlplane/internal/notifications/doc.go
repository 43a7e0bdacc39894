// Package notifications owns GET /ws/notifications: the WebSocket that pushes a signed-in
// user's notifications as they happen, and the channels they travel on (seed §6.2): a
// per-user channel (UserChannel), a per-organization channel (OrgChannel, one per
// tenant) and a broadcast channel (Broadcast).
//
// Where messages come from:
//   - domain events the outbox relay publishes on the events stream: allocation status
//     changes (allocation.<status>) and budget events (budget.threshold_crossed,
//     budget.suspend_requested) go to their tenant's organization channel;
//   - Publisher.Publish / Hub.Broadcast, for any feature or operator message, over NATS
//     subjects <prefix>user.<id>, <prefix>org.<id> and <prefix>broadcast.
//
// Every replica subscribes to all of them with plain (core) NATS subscriptions, so a
// message reaches the clients connected to any replica, and delivers to its own
// connections only. Delivery is best effort and never persisted: a client that is not
// connected, or too slow to keep up, misses messages and resyncs through the REST API.
//
// Who gets what: a connection is subscribed to its user's channel, its user's tenant's
// channel and broadcast. An organization message about a project is written only to
// connections whose user can see that project (tenancy's project access, cached per
// connection for 60 seconds), so a member of one project never learns about another's
// allocations, and a user of another tenant never shares a channel with them at all.
//
// What it must never do: read another feature's tables, put a secret or a token into a
// message (Publisher refuses secret-like fields; domain events are copied field by field
// from an allowlist), accept a token from a query string, or block the fan-out on one
// slow client.
package notifications
