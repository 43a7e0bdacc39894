package runtime

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/gantry-gpu/gantry/nodeagent/config"
)

// Runtime names (the `runtime` configuration key).
const (
	NameProcess   = "process"
	NameLinuxUser = "linux-user"
)

// FromConfig builds the Runtime the agent's configuration asks for, reading GPUs from inv
// (the agent's GPU backend). See SelectedName and StateDir for the defaults.
func FromConfig(cfg config.Config, inv Inventory, log *slog.Logger) (*Runtime, error) {
	name := SelectedName(cfg)
	dir := StateDir(cfg)
	var d Driver
	switch name {
	case NameProcess:
		d = &Process{Root: filepath.Join(dir, "allocations")}
	case NameLinuxUser:
		if os.Geteuid() != 0 {
			return nil, errors.New("runtime linux-user creates accounts and needs root; set runtime = process (GANTRY_NODEAGENT_RUNTIME=process) for development")
		}
		d = &LinuxUser{HomeRoot: cfg.HomeRoot, Runner: Exec{}, Logger: log}
	default:
		return nil, fmt.Errorf("runtime %q is not auto, process or linux-user", cfg.Runtime)
	}
	host := cfg.AdvertiseHost
	if host == "" {
		host = cfg.Hostname
	}
	if host == "" {
		if h, err := os.Hostname(); err == nil && h != "" {
			host = h
		} else {
			host = "localhost"
		}
	}
	return New(Options{
		Driver:        d,
		StateDir:      dir,
		Inventory:     inv,
		AdvertiseHost: host,
		SSHPort:       cfg.SSHPort,
		StopGrace:     cfg.StopGrace,
		Logger:        log,
	})
}

// SelectedName resolves runtime = auto: the process runtime on a mock GPU backend (a
// development host has no GPUs to give away and usually no root), linux-user on nvml.
func SelectedName(cfg config.Config) string {
	if cfg.Runtime != "auto" && cfg.Runtime != "" {
		return cfg.Runtime
	}
	if strings.HasPrefix(cfg.GPUBackend, "mock-") {
		return NameProcess
	}
	return NameLinuxUser
}

// StateDir resolves state_dir: the configured directory, else "state"; a relative path is
// relative to the config file's directory, so `make dev` and tests (a config in a
// temporary directory) keep their state beside their config, and the systemd unit points
// it at /var/lib/gantry-nodeagent.
func StateDir(cfg config.Config) string {
	if cfg.StateDir != "" {
		return cfg.Resolve(cfg.StateDir)
	}
	return cfg.Resolve("state")
}
