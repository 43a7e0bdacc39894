package proxy_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/gantry-gpu/gantry/shared/testenv"
)

// TestMain fails the package when a test leaves a goroutine behind (a pooled stream,
// a WebSocket pipe, a relay not closed).
func TestMain(m *testing.M) {
	testenv.MainThen(m, func() error {
		return goleak.Find(goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
	})
}
