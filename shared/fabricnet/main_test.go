package fabricnet_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain runs the crash tests' child listener when asked to (crashChild), and
// otherwise the tests, failing the package if any goroutine outlives them: a tunnel,
// stream or listener left running is a leak every agent and replica would repeat.
func TestMain(m *testing.M) {
	if os.Getenv(envCrashChild) != "" {
		crashChild()
		return
	}
	goleak.VerifyTestMain(m)
}
