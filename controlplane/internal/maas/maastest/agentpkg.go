package maastest

import (
	"context"
	"os"

	"github.com/gantry-gpu/gantry/deploy/packaging"
)

// AgentVersion is the version of the agent package BuildAgentPackage builds.
const AgentVersion = "0.0.0-maastest"

// BuildAgentPackage compiles gantry-nodeagent from this repository (the working
// directory must be inside it) and packages it with deploy/packaging into dir. It
// returns the .deb's path; its .sha256 lies beside it. This is the package a control
// plane under test serves (GANTRY_NODEAGENT_PACKAGE) and AgentBooter's machines install.
func BuildAgentPackage(ctx context.Context, dir string) (string, error) {
	root, err := packaging.RepoRoot(".")
	if err != nil {
		return "", err
	}
	bin, err := packaging.BuildAgent(ctx, root, dir, AgentVersion, "amd64")
	if err != nil {
		return "", err
	}
	defer os.Remove(bin)
	return packaging.WriteFiles(packaging.Options{Binary: bin, Version: AgentVersion}, dir)
}
