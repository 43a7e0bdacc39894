// Package machineid owns machine identities (issue 19 item 5): service accounts (tenant
// owned, with a role in each of their projects), project access credentials (bound to
// one project with one role), their client credentials (client id + secret; the secret
// is shown once and stored as SHA-256), and the OAuth 2.0 client-credentials grant of
// POST /api/v1/auth/token (grant.go), which exchanges a credential for a short-lived
// machine access token signed by auth (auth/machine.go).
//
// Every machine identity acts as a users row of its own, with no password and no tenant,
// so what it creates has an owner and audit rows an actor; its rights are only the
// project roles in its token. It must never hold a tenant role, a platform capability or
// a second factor: authz refuses it everything but project-role operations and the few
// marked ForMachines, and auth never marks its token stepped up.
package machineid
