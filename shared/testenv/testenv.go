package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

var (
	cleanupMu sync.Mutex
	cleanups  []func()
)

// onExit registers fn to run when Main's tests have finished (last first).
func onExit(fn func()) {
	cleanupMu.Lock()
	defer cleanupMu.Unlock()
	cleanups = append(cleanups, fn)
}

// Main runs the tests, stops the throwaway services this process started and
// exits with the tests' status. Call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	Shutdown()
	os.Exit(code)
}

// Shutdown stops the throwaway services this process started. Main calls it;
// call it yourself only from a TestMain that does not use Main.
func Shutdown() {
	cleanupMu.Lock()
	fns := cleanups
	cleanups = nil
	cleanupMu.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}

// InCI reports whether CI is set to a true value (CI=true, CI=1); see package ci.
func InCI() bool { return ci.Enabled() }

// unavailable skips the test, or fails it under CI, with the reason (the repository's
// one rule for skips, package ci).
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	ci.Missing(t, "testenv: "+fmt.Sprintf(format, args...))
}

// Namespace returns 8 random hex characters for naming streams, KV buckets,
// subjects and the like, so tests and test packages sharing one server never
// collide. Each call returns a new value.
func Namespace(t testing.TB) string {
	t.Helper()
	return randomHex(t, 4)
}

func randomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("testenv: random: %v", err)
	}
	return hex.EncodeToString(b)
}

// once memoizes a process-wide lookup: the value, or why there is none.
type once[T any] struct {
	mu   sync.Mutex
	done bool
	val  T
	err  error
}

func (o *once[T]) get(fn func() (T, error)) (T, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.done {
		o.val, o.err = fn()
		o.done = true
	}
	return o.val, o.err
}
