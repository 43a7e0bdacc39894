// Package e2e holds end-to-end tests that run a real control plane (apitest: the same
// assembly as production on real PostgreSQL and NATS) together with real node agents
// in-process (nodeagent/agent on go-nvml's mock DGX servers) or as the installed
// binary. It has no non-test code beyond this comment; it sits inside the controlplane
// tree so it may import controlplane/internal packages.
package e2e
