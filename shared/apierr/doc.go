// Package apierr owns the error envelope every Gantry HTTP surface answers with: the
// stable code enum of the contract (seed §7.2), our code -> HTTP status table
// (ARCHITECTURE §3), and the one writer that turns any error into the envelope.
//
// It must never let raw cause text (database, provider, panic) reach a client: only the
// Message of an *Error is shown, and anything that is not an *Error becomes
// internal_error.
package apierr
