package objects_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/gantry-gpu/gantry/shared/testenv"
)

// TestMain fails the package when a test leaves a goroutine behind (an upload or a
// download not ended). The S3 test server (storage/blob/s3test) runs until the process
// ends, as its parent-death signal ends it: its process-watching goroutines are not
// leaks.
func TestMain(m *testing.M) {
	testenv.MainThen(m, func() error {
		return goleak.Find(
			goleak.IgnoreAnyFunction("github.com/gantry-gpu/gantry/controlplane/internal/storage/blob/s3server.Start.func1"),
			goleak.IgnoreAnyFunction("os/exec.(*Cmd).Start.func2"))
	})
}
