// Package runtime is what an allocation is on a GPU host: the user its owner logs in as,
// the SSH keys that user accepts, and the environment that makes only the allocated GPUs
// visible. It runs the four allocation task kinds of shared/alloctask (provision, stop,
// restart, release) through a Driver, keeps one small JSON record per allocation on disk,
// and answers Session lookups for the agent's terminal.
//
// Two drivers exist, chosen by the agent's `runtime` setting:
//
//   - Process (development and tests, unprivileged): a workspace directory per allocation
//     (<state dir>/allocations/<allocation id>/ with home/, authorized_keys and env); the
//     allocation's processes run as the agent's own user. Stop and release signal the
//     processes whose environment carries GANTRY_ALLOCATION_ID=<allocation id>.
//   - LinuxUser (real hosts, root): a dedicated account per allocation (useradd), its
//     ~/.ssh/authorized_keys, ~/.gantry/env sourced by ~/.profile and ~/.bashrc, and where
//     systemd runs the host a drop-in on the user's slice (user-<uid>.slice) with
//     DevicePolicy=closed that admits only the allocated /dev/nvidiaN. Stop expires the
//     account (no new logins) and kills its processes; release removes it.
//
// Every operation is idempotent and keyed by allocation id. A task that arrives again after
// the agent restarted (tasks.Once forgot it) finds the record and the host state the first
// run left and finishes the work instead of doing it twice; release of an allocation this
// node never saw succeeds as already clean. A released allocation leaves a tombstone record
// (kept TombstoneTTL) so a provision that arrives late, after its release, is refused
// instead of bringing back an account nobody pays for.
//
// # Session lookup for the terminal
//
// Runtime.Session(allocationID) returns a SessionEnv for an allocation that is provisioned
// and not stopped or released (false otherwise):
//
//   - User: the runtime user name (alloctask.UserName of the allocation id).
//   - RealUser, UID, GID: RealUser is true under LinuxUser; the terminal then starts its
//     shell with syscall.Credential{Uid: UID, Gid: GID} (and the supplementary groups of
//     that user). Under Process, RealUser is false and UID/GID are 0: run as the agent's
//     own user.
//   - Dir: the working directory (the allocation's home).
//   - Shell: the login shell to start (/bin/bash under LinuxUser, $SHELL or /bin/sh under
//     Process).
//   - Env: KEY=VALUE pairs, sorted: HOME, USER, LOGNAME, SHELL, CUDA_VISIBLE_DEVICES,
//     NVIDIA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, GANTRY_ALLOCATION_ID. The caller adds
//     PATH, TERM and the like. Start every process of the allocation with it: Stop and
//     Release under Process find the allocation's processes by GANTRY_ALLOCATION_ID.
//   - Slice: "user-<uid>.slice" when a device policy was installed for the user (systemd
//     hosts), else "". A process the agent starts itself is not in that slice unless it
//     is started there (e.g. systemd-run --scope --slice=<Slice> --uid=<UID>); SSH logins
//     land there through pam_systemd.
//
// The package never talks to the control plane and never decides what an allocation
// should be: the task payload says it; the runtime only makes the host match.
package runtime
