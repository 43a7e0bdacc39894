// Package devenv is what `gantry-controlplane dev` (make dev) stands on: it finds or
// starts the services the control plane needs, keeps the development secrets, and seeds
// the accounts a developer logs in with.
//
// Start resolves PostgreSQL (DATABASE_URL; else the local server on 127.0.0.1:5432,
// database gantry_dev, created when missing; else a throwaway cluster under <dir>/pg
// from the machine's binaries) and NATS (NATS_URL; else an embedded nats-server with
// JetStream under <dir>/nats), applies the migrations, and loads or creates
// <dir>/secrets.env (0600): the master key and the admin and demo passwords, reused on
// every later run so logins stay valid. Env.Close stops what Start started.
//
// Seed creates, idempotently, the platform admin "admin", the demo tenant "Demo" (through
// tenancy's provisioning, so it is built exactly like a real tenant) and its tenant admin
// "demo", who owns the tenant's default project. A second run finds everything and
// changes nothing, except passwords that no longer match secrets.env, which it resets.
package devenv
