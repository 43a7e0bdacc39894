package runtime

import (
	"context"
	"time"

	"github.com/gantry-gpu/gantry/nodeagent/gpu"
)

// Driver is how an allocation exists on the host: Process (a workspace directory,
// processes run as the agent's user) or LinuxUser (a dedicated account). The Runtime owns
// the records, the transition table and the locking; a driver only changes the host, and
// every method must be idempotent — called again after success, or after a crash half-way,
// it finishes the work and succeeds.
type Driver interface {
	// Name is the `runtime` setting that selects the driver ("process", "linux-user").
	Name() string
	// Provision makes the allocation's account and files exist as spec says and lets it
	// run (undoing Lock), and returns the account.
	Provision(ctx context.Context, spec Spec) (Account, error)
	// Lock stops new sessions of the allocation from starting. An allocation that does
	// not exist on the host is already locked.
	Lock(ctx context.Context, spec Spec) error
	// Kill ends every process of the allocation: SIGTERM, then SIGKILL to whatever is
	// left after grace. Nothing running is success.
	Kill(ctx context.Context, spec Spec, grace time.Duration) error
	// Release removes everything of the allocation from the host (processes, account,
	// files). An allocation that does not exist on the host is already released.
	Release(ctx context.Context, spec Spec) error
}

// Spec is what a driver is asked to make true: the allocation, its runtime user name,
// its GPUs (inventory entries, in index order; empty for stop and release) and its SSH
// public keys.
type Spec struct {
	AllocationID  string
	User          string
	GPUs          []gpu.GPU
	SSHPublicKeys []string
}

// Account is an allocation as a driver made it.
type Account struct {
	User string `json:"user"`
	// RealUser is true when User is a host account (LinuxUser); UID and GID are then its
	// ids. Under Process they are 0 and processes run as the agent's own user.
	RealUser bool   `json:"real_user"`
	UID      uint32 `json:"uid"`
	GID      uint32 `json:"gid"`
	Home     string `json:"home"`
	Shell    string `json:"shell"`
	// Slice is the systemd slice whose device policy admits only the allocated GPUs
	// ("user-<uid>.slice"), or "" when no device policy is installed.
	Slice string   `json:"slice,omitempty"`
	Env   []string `json:"env"`
}
