// Package ci holds the repository's one rule for tests that need something the machine
// may lack (a binary, root, a service): outside CI such a test skips, saying what is
// missing; under CI=true it fails instead, so nothing skips silently in CI. Every skip
// in the repository goes through SkipUnlessAvailable or Missing.
//
// A test that needs hardware CI never has (a GPU and its driver) does not skip at all:
// it is left out of ordinary builds by a build tag and run on purpose where the hardware
// is (see the nvml tag in docs/nodeagent.md), where a missing driver is a failure.
//
// It is a package of its own, with no dependencies, so that the packages testenv builds
// on (pgcluster, natsenv) can use it in their own tests.
package ci

import (
	"os"
	"strconv"
	"testing"
)

// Enabled reports whether CI is set to a true value (CI=true, CI=1).
func Enabled() bool {
	v, _ := strconv.ParseBool(os.Getenv("CI"))
	return v
}

// SkipUnlessAvailable does nothing when err is nil. Otherwise what (a binary, root, a
// service) is missing for the reason err: the test is skipped, or under CI=true fails.
func SkipUnlessAvailable(t testing.TB, what string, err error) {
	t.Helper()
	if err != nil {
		Missing(t, what+": "+err.Error())
	}
}

// Missing skips the test because of reason, or fails it under CI=true.
func Missing(t testing.TB, reason string) {
	t.Helper()
	if Enabled() {
		t.Fatalf("%s (CI=true, so failing instead of skipping)", reason)
		return
	}
	t.Skipf("%s (skipped; under CI=true this fails)", reason)
}
