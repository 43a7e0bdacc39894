package terminal_test

import (
	"github.com/gantry-gpu/gantry/nodeagent/agent"
	"github.com/gantry-gpu/gantry/nodeagent/terminal"
)

// The terminal server is what the agent's Options.Streams takes.
var _ agent.StreamHandler = (*terminal.Server)(nil)
