// Package sharedruntimes owns shared runtimes (docs/apps.md, Shared runtimes): one app
// version served by workers (app instances on allocations of an owner project) that
// several projects use through the app proxy. It admits attached projects' members to
// the workers (proxy.Grants), meters their calls (proxy.Meter: one unit per call, keyed
// by the proxy's call id) and rates the units into the attached project's ledger as
// usage_source app_runtime through the billing engine's usage records, so each unit is
// rated once and never together with the allocations the owner project pays for.
// Worker state follows the workers' app instances, written and audited
// (shared_runtime.worker.report) only when it changes; worker and repair operations
// restart or drain workers through the instances service.
//
// It never starts processes on nodes itself: workers are app instances.
package sharedruntimes
