package runtime

import "slices"

// SessionEnv is how the agent starts a process for an allocation (the terminal's shell):
// as whom, where, and with which environment. See the package documentation.
type SessionEnv struct {
	AllocationID string
	// User is the runtime user name.
	User string
	// RealUser is true when User is a host account (linux-user runtime): start the
	// process with credentials UID/GID. False (process runtime): UID and GID are 0 and
	// the process runs as the agent's own user.
	RealUser bool
	UID      uint32
	GID      uint32
	// Dir is the working directory: the allocation's home.
	Dir string
	// Shell is the shell to start.
	Shell string
	// Env is KEY=VALUE, sorted: HOME, USER, LOGNAME, SHELL, CUDA_VISIBLE_DEVICES,
	// NVIDIA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER and GANTRY_ALLOCATION_ID. Callers add
	// PATH, TERM and the like.
	Env []string
	// Slice is the systemd slice with the allocation's device policy, or "".
	Slice string
}

// Session returns how to start a process for the allocation, if it is provisioned here
// and neither stopped nor released; a terminal must not open otherwise.
func (r *Runtime) Session(allocationID string) (SessionEnv, bool) {
	r.mu.RLock()
	rec, ok := r.records[allocationID]
	r.mu.RUnlock()
	if !ok || rec.Phase != PhaseActive || rec.Account == nil {
		return SessionEnv{}, false
	}
	a := rec.Account
	return SessionEnv{
		AllocationID: allocationID,
		User:         a.User,
		RealUser:     a.RealUser,
		UID:          a.UID,
		GID:          a.GID,
		Dir:          a.Home,
		Shell:        a.Shell,
		Env:          slices.Clone(a.Env),
		Slice:        a.Slice,
	}, true
}
