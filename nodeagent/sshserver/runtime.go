package sshserver

import (
	"os"
	"path/filepath"

	"github.com/gantry-gpu/gantry/nodeagent/runtime"
)

// SessionLookup is the allocation runtime's side of Environments (*runtime.Runtime).
type SessionLookup interface {
	Session(allocationID string) (runtime.SessionEnv, bool)
}

// RuntimeEnvironments adapts the allocation runtime: an allocation is reachable exactly
// when the runtime answers Session for it (provisioned, neither stopped nor released).
func RuntimeEnvironments(rt SessionLookup) Environments {
	return EnvironmentsFunc(func(allocationID string) (Env, bool) {
		s, ok := rt.Session(allocationID)
		if !ok {
			return Env{}, false
		}
		return Env{
			AllocationID: allocationID, User: s.User, RealUser: s.RealUser, Dir: s.Dir, Shell: s.Shell, Env: s.Env,
			AuthorizedKeys: AuthorizedKeysPath(s.Dir),
		}, true
	})
}

// AuthorizedKeysPath is where the runtime keeps an allocation's keys: ~/.ssh/authorized_keys
// when the home has one (linux-user), else the process runtime's workspace file beside
// the home (<workspace>/authorized_keys, nodeagent/runtime/process.go).
func AuthorizedKeysPath(home string) string {
	p := filepath.Join(home, ".ssh", "authorized_keys")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return filepath.Join(filepath.Dir(home), "authorized_keys")
}
