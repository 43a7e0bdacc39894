// Package allocations owns GPU allocations: the launch checks, placement on a node, the
// reservation of its GPUs, the status history and the HTTP operations under
// /api/v1/allocations and /api/v1/allocation-groups (docs/allocations.md). Status moves
// go through the one state machine in the lifecycle subpackage; this package persists
// them, each with its status event, agent task, outbox event and audit row in one
// transaction. Besides requests and agent reports, two things move allocations: the
// stop consumer (budget suspension and runway exhaustion events from JetStream) and idle
// detection (GPU utilization from the fleet view).
//
// It never reads another feature's tables: SKUs and prices come through Catalog, GPU
// inventory and telemetry through Fleet, keys through Keys, money through Billing and
// Budgets (placement's candidates come from nodes.Service.PlacementCandidates). It must
// never give a GPU to two live allocations: a create claims its GPUs with an insert that
// the partial unique index on allocation_gpus (allocation_gpus_held_key) decides, and a
// claim that loses moves on to the next free GPU; a group places alone under the GPU
// model's exclusive lock and is placed whole in one transaction or not at all.
package allocations
