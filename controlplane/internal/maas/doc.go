// Package maas is Gantry's bare-metal lifecycle through Canonical MAAS (docs/maas.md):
// MAAS sites and their API keys (sealed under the master key, never returned), the sync
// of their machines, onboarding profiles, and the two durable workflows — onboarding
// (allocate -> commission -> node record + enrollment token -> deploy with cloud-init ->
// wait Deployed -> wait for the agent -> uncordon) and decommission (cordon -> drain ->
// revoke token -> release with erase -> retire). Each workflow step is a River job
// inserted in the transaction that records the step, so a restart resumes where it was.
//
// The package must never pass MAAS's own error text to a client (it is logged with the
// correlation id and mapped to upstream_error), and never return an API key.
package maas
