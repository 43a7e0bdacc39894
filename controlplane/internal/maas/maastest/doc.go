// Package maastest is a MAAS API 2.0 simulator for tests, benchmarks and `make dev`
// (GANTRY_DEV_MAAS=1). It speaks what github.com/canonical/gomaasclient v0.15.0 sends —
// paths under /MAAS/api/2.0/, `op=` actions, form bodies (urlencoded or multipart), and
// OAuth 1.0a PLAINTEXT signatures checked against the configured API keys — and keeps
// machines in MAAS's own status model (../shared/design/MAAS.md): New → Commissioning →
// Testing → Ready → Allocated → Deploying → Deployed → Releasing → (Disk erasing) → Ready,
// with Broken, Missing and the Failed* states.
//
// Every timed step (commissioning, testing, deploying, releasing, erasing) takes a
// configurable duration (zero: done right after the call returns). Failures are injected
// per machine: FailCommissioning, FailTesting, FailDeployment, FailReleasing, FailErasing,
// Missing and PowerFailure.
//
// When a machine reaches Deployed, the Booter "boots" it. AgentBooter does it for real:
// it validates the base64 user data with Debian's `cloud-init schema`, writes the
// document's write_files into a sandbox directory and runs its runcmd there (the
// gantry-bootstrap script of deploy/cloud-init, with GANTRY_ROOT set: it fetches the
// agent package and checksum from the control plane and unpacks it with dpkg-deb -x,
// then enrolls), and starts the unpacked gantry-nodeagent on go-nvml's mock GPUs, so the
// node enrolls and connects over the fabric like a real one. Release, abort and power
// off stop that agent.
//
// The simulator never imports the control plane: it is MAAS, seen from outside.
package maastest
