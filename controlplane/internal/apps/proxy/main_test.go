package proxy_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/gantry-gpu/gantry/shared/testenv"
)

// TestMain fails the package when a test leaves a goroutine behind (a pooled stream,
// a WebSocket pipe, a relay not closed).
//
// With GANTRY_PROXY_TEST_APP=1 the binary is the test app instead (testAppMain): the
// node's app supervisor starts it as an instance's process.
func TestMain(m *testing.M) {
	if os.Getenv("GANTRY_PROXY_TEST_APP") == "1" {
		testAppMain()
		return
	}
	testenv.MainThen(m, func() error {
		return goleak.Find(goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
	})
}
