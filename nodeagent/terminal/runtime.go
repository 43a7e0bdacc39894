package terminal

import "github.com/gantry-gpu/gantry/nodeagent/runtime"

// SessionLookup is the allocation runtime's side of Environments (*runtime.Runtime).
type SessionLookup interface {
	Session(allocationID string) (runtime.SessionEnv, bool)
}

// RuntimeEnvironments adapts the allocation runtime: an allocation is live for the
// terminal exactly when the runtime answers Session for it (provisioned, neither stopped
// nor released).
func RuntimeEnvironments(rt SessionLookup) Environments {
	return EnvironmentsFunc(func(allocationID string) (SessionEnv, bool) {
		s, ok := rt.Session(allocationID)
		if !ok {
			return SessionEnv{}, false
		}
		return SessionEnv{
			User:     s.User,
			RealUser: s.RealUser,
			UID:      s.UID,
			GID:      s.GID,
			Dir:      s.Dir,
			Shell:    s.Shell,
			Env:      s.Env,
			Slice:    s.Slice,
		}, true
	})
}
