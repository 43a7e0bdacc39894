package agent_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: the agent's run
// loop, tunnel, heartbeat, dispatch and result-flush goroutines must all end when Run
// returns.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
