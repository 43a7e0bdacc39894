package testenv

import (
	"fmt"
	"os"
	"testing"
)

// MainThen is Main with a check that runs after the tests have passed and the throwaway
// services are stopped: a failing check fails the test binary. Packages that start
// goroutines pass their goroutine-leak check here (goleak.Find), which must run after
// Shutdown so that an embedded server this process started is not taken for a leak.
func MainThen(m *testing.M, check func() error) {
	code := m.Run()
	Shutdown()
	if code == 0 {
		if err := check(); err != nil {
			fmt.Fprintf(os.Stderr, "after the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
