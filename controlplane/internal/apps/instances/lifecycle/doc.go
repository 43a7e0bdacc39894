// Package lifecycle is the app instance state machine: the seven states of an app
// instance (requested → starting → running ⇄ unhealthy → stopping → stopped, and
// failed), the events that move an instance between them (the node agent's controller
// reports, the control plane's own commands), and the contract error each forbidden move
// maps to. It is pure Go: no database, no clock, no I/O. The instances feature applies a
// move with Apply inside the transaction that persists it, and writes the audit row only
// when the Outcome says the state changed (seed §6.2 rule 1: a report that repeats the
// persisted state is telemetry).
//
// The whole table is in docs/apps.md; a test keeps that page and this table identical.
//
// It must never decide anything but the move itself: whether the caller may act on the
// instance is decided before Apply is called.
package lifecycle
