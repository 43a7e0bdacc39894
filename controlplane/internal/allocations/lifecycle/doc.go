// Package lifecycle is the allocation (workload) state machine: every status of seed §3,
// the events that move an allocation between them, and the contract error each
// forbidden move maps to. It is pure Go: no database, no clock, no I/O. The allocations
// feature applies a move with Apply inside the transaction that persists it, and writes
// the status event, outbox event and audit row only when the Outcome says the status
// changed.
//
// The whole table, with the reasons for the decisions the seed leaves open, is in
// docs/allocation-lifecycle.md; a test keeps that page and this table identical.
//
// It must never decide anything but the move itself: whether the caller may act on the
// allocation (permissions, tenancy, budgets) is decided before Apply is called.
package lifecycle
