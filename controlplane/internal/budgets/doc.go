// Package budgets owns spending budgets: tenant- and project-scoped limits in one
// currency per period (monthly, quarterly, annual: UTC calendar periods; custom: one
// [starts_at, ends_at) window), their evaluation into deduplicated BillingBudgetEvents,
// the dry-run decision endpoint, and the launch decision the allocation side calls
// (DecideLaunch).
//
// Spend comes from a SpendSource (billing's rated usage, in minor units of one currency).
// The package never reads billing's tables and never converts or sums currencies: a
// budget is compared only with spend in its own currency, and a proposal in another
// currency adds nothing to it.
//
// The one comparison (Reached) is ">=", exact in integers: a threshold is crossed at
// exactly threshold_percent, and a budget is exhausted at exactly 100 %. See
// docs/budgets.md for the reasoning and the enforcement modes:
//   - notify_only never blocks anything;
//   - block_launch makes DecideLaunch refuse new launches once the launch would bring
//     the period's spend to 100 % (running workloads are left alone);
//   - suspend blocks launches like block_launch and, when evaluation first sees 100 %
//     in a period, enqueues budget.suspend_requested (outbox) for the allocation side to
//     stop the running workloads in scope.
//
// The decision endpoint and DecideLaunch write nothing. Evaluation writes events, their
// outbox events and audit rows only; acknowledge/resolve move an event's status forward
// only (open -> acknowledged -> resolved, or open -> resolved).
package budgets
