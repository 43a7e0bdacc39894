// Package allocations owns GPU allocations: the launch checks, placement on a node, the
// reservation of its GPUs, the status history and the HTTP operations under
// /api/v1/allocations (docs/allocations.md). Status moves go through the one state
// machine in the lifecycle subpackage; this package persists them, each with its status
// event, outbox event and audit row in one transaction.
//
// It never reads another feature's tables: SKUs and prices come through Catalog, GPU
// inventory through Fleet, keys through Keys, money through Billing and Budgets. It
// must never give a GPU to two live allocations: placement serializes per GPU model
// and a partial unique index on allocation_gpus stands behind it.
package allocations
