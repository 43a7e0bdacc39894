// Package nodes owns node administration: the node records an admin creates, probes
// (package probe), cordons and drains; one-time enrollment tokens and the long-lived node
// bearer tokens they are traded for (format in shared/nodetoken; stored as SHA-256 only,
// shown once); rotation, revocation and introspection of those tokens; the GPU inventory
// and latest telemetry the fabric reports; and the fleet telemetry read model.
//
// It implements fleet.Directory for the fabric and consumes the fabric through
// fleet.PresenceReader, fleet.Disconnector and fleet.FabricInfo, all optional: a nil
// PresenceReader means no live heartbeat data (status comes from what the fabric
// persisted through NodeStatus), a nil Disconnector does nothing, a nil FabricInfo hands
// an enrolling agent an empty CA and address. It never imports the fabric.
//
// Writes the fabric causes are change-only: NodeStatus writes only when the status
// differs from the persisted one, NodeConnected only what differs from the stored
// identity and inventory, and NodeTelemetry coalesces routine samples (see
// telemetry.go). Admin mutations write their audit row and outbox event in the same
// transaction; a repeated request that changes nothing writes neither.
//
// Error codes where the contract has no dedicated one (seed §7.2, ARCHITECTURE §3):
//   - duplicate name or address+port: 409 node_already_exists; unknown node: 404
//     node_not_found.
//   - a denied probe target: 400 invalid_request, details {field: address, reason:
//     probe_target_denied, target_reason}; nothing is persisted and no connection made.
//   - a schedule transition the table forbids (cordon while draining): 409
//     invalid_request, details {reason: schedule_transition_invalid, from, action}.
//   - deleting a node that live allocations use, or an online node that is still
//     schedulable (cordon or drain it first): 409 node_in_use.
//   - enroll with an unknown or used enrollment token: 401 token_invalid; an expired
//     one: 401 token_expired.
//   - a node token for another node than the {node_id} of a node-facing path: 403
//     insufficient_permissions, details.reason node_mismatch (the token itself was
//     valid, so it is not a 401).
package nodes
