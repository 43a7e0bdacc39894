package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/gantry-gpu/gantry/nodeagent/internal/atomicfile"
)

// Process is the unprivileged driver for development and tests: an allocation is a
// workspace directory, <Root>/<allocation id>/, holding
//
//	home/             the allocation's HOME
//	authorized_keys   the requested SSH keys (0600), for inspection: no sshd reads it
//	env               the environment (`export KEY='value'` lines)
//
// and its processes run as the agent's own user. The workspace gives no isolation from
// the agent or from other allocations; it exists so that `make dev` and the tests run the
// whole allocation lifecycle without root.
type Process struct {
	// Root holds the workspaces (the runtime's <state dir>/allocations).
	Root string
	// ProcDir is /proc (tests may point elsewhere); the processes of an allocation are
	// found by GANTRY_ALLOCATION_ID in /proc/<pid>/environ.
	ProcDir string
}

// Name implements Driver.
func (d *Process) Name() string { return "process" }

func (d *Process) workspace(id string) string { return filepath.Join(d.Root, id) }

// Provision implements Driver.
func (d *Process) Provision(ctx context.Context, s Spec) (Account, error) {
	ws := d.workspace(s.AllocationID)
	home := filepath.Join(ws, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		return Account{}, err
	}
	shell := os.Getenv("SHELL")
	if shell == "" {
		shell = "/bin/sh"
	}
	env := allocationEnv(s.AllocationID, s.User, home, shell, s.GPUs)
	if err := atomicfile.Write(filepath.Join(ws, "authorized_keys"), authorizedKeys(s.SSHPublicKeys), 0o600); err != nil {
		return Account{}, err
	}
	if err := atomicfile.Write(filepath.Join(ws, "env"), envFile(env), 0o600); err != nil {
		return Account{}, err
	}
	return Account{User: s.User, Home: home, Shell: shell, Env: env}, nil
}

// Lock implements Driver. There is no account to lock: a stopped allocation's record
// is what makes Session refuse new terminals.
func (d *Process) Lock(context.Context, Spec) error { return nil }

// Kill implements Driver.
func (d *Process) Kill(ctx context.Context, s Spec, grace time.Duration) error {
	return killTagged(ctx, d.procDir(), s.AllocationID, grace)
}

// Release implements Driver.
func (d *Process) Release(ctx context.Context, s Spec) error {
	if err := killTagged(ctx, d.procDir(), s.AllocationID, 0); err != nil {
		return err
	}
	if err := os.RemoveAll(d.workspace(s.AllocationID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing the workspace: %w", err)
	}
	return nil
}

func (d *Process) procDir() string {
	if d.ProcDir != "" {
		return d.ProcDir
	}
	return "/proc"
}
