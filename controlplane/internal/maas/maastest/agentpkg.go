package maastest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	"github.com/gantry-gpu/gantry/deploy/packaging"
)

// AgentVersion is the version of the agent package BuildAgentPackage builds.
const AgentVersion = "0.0.0-maastest"

// agentCGOFlags are the Makefile's CGO_CFLAGS, which the e2e tests' agent build sets too:
// CGO_CFLAGS is part of every cgo package's build-cache key, so a build under another
// value (a plain `go test` has none) recompiles go-nvml's C instead of reusing it.
const agentCGOFlags = "-O2 -g -Wno-deprecated-declarations"

// agentDeb is the package, built at most once per test binary: a compile of the agent
// costs a link at best and minutes on a loaded machine with a cold cache, and every
// real-boot test of the process boots the same bytes.
var agentDeb struct {
	once sync.Once
	deb  []byte
	err  error
}

// BuildAgentPackage compiles gantry-nodeagent from this repository (the working
// directory must be inside it) and packages it with deploy/packaging; it writes the .deb
// into dir and returns its path; its .sha256 lies beside it. This is the package a
// control plane under test serves (GANTRY_NODEAGENT_PACKAGE) and AgentBooter's machines
// install. Only the first call of a process builds; later ones write the same bytes.
func BuildAgentPackage(ctx context.Context, dir string) (string, error) {
	agentDeb.once.Do(func() { agentDeb.deb, agentDeb.err = buildAgentDeb(ctx) })
	if agentDeb.err != nil {
		return "", agentDeb.err
	}
	name := packaging.FileName(AgentVersion, "amd64")
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, agentDeb.deb, 0o644); err != nil {
		return "", err
	}
	sum := sha256.Sum256(agentDeb.deb)
	if err := os.WriteFile(p+".sha256", []byte(hex.EncodeToString(sum[:])+"  "+name+"\n"), 0o644); err != nil {
		return "", err
	}
	return p, nil
}

// buildAgentDeb builds the agent as the e2e tests do (controlplane/e2e/install_test.go):
// no -trimpath (which `make package`'s packaging.BuildAgent uses for reproducible
// releases) and no -race, so that its packages' compiles are shared through the build
// cache with those tests' and the agent's own non-race builds rather than made a second
// time in -trimpath form. The version goes in at link time, which the cache never reuses.
func buildAgentDeb(ctx context.Context) ([]byte, error) {
	root, err := packaging.RepoRoot(".")
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "maastest-agent-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "gantry-nodeagent")
	cmd := exec.CommandContext(ctx, "go", "build", "-ldflags", "-X main.version="+AgentVersion,
		"-o", bin, "github.com/gantry-gpu/gantry/nodeagent/cmd/gantry-nodeagent")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_CFLAGS="+agentCGOFlags, "CGO_ENABLED=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build gantry-nodeagent: %w: %s", err, bytes.TrimSpace(b))
	}
	// Packaged by deploy/cmd/gantry-package in its own (cached, non-race) process: in this
	// one, under -race, gzipping the ~40 MB binary into the .deb took longer than the
	// whole agent build from a warm cache.
	pkg := exec.CommandContext(ctx, "go", "run", "github.com/gantry-gpu/gantry/deploy/cmd/gantry-package",
		"-binary", bin, "-version", AgentVersion, "-out", tmp)
	pkg.Dir = root
	if b, err := pkg.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("package gantry-nodeagent: %w: %s", err, bytes.TrimSpace(b))
	}
	return os.ReadFile(filepath.Join(tmp, packaging.FileName(AgentVersion, "amd64")))
}
