// Package instances owns app instances: an app version of the catalog running on an
// allocation of a project (docs/apps.md). It launches an instance on an existing live
// allocation of the project, or on a new allocation it asks the allocations feature for
// (with that feature's launch checks, in the same transaction); it stops instances;
// it applies the node agent's controller reports; and its reconcile pass starts
// instances whose allocation became active, ends those whose allocation ended, fails
// those never healthy in time, delivers its node tasks (app.start, app.stop,
// app.bootstrap_ssh) and reconciles bootstrap SSH trust.
//
// Every state move goes through the lifecycle subpackage's one table and is written in
// one transaction with its audit row and outbox event; a move the table calls a repeat
// writes no audit row (seed §6.2 rule 1: 100 identical reports are one audit row), and a
// bootstrap SSH reconcile is audited only when it enqueues a task or changes the
// requested trust (rule 2).
//
// It never reads another feature's tables: allocations come through Allocations, app
// versions and entitlements through Catalog, the node through Dispatcher.
package instances
