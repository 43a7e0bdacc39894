// Package s3test runs a real S3 API server for tests: versitygw v1.8.0 (STACK.md) over a
// temporary directory, on a free loopback port (package s3server starts it). The binary
// is found on PATH or in $(go env GOPATH)/bin, where .ci/run installs it with
// `go install`. Without it a test skips with the reason, except under CI=true, where it
// fails (shared/testenv/ci).
//
// One server is started per test process, on first use, and stopped (its directory
// removed) by Main; each caller gets a bucket of its own, so tests run in parallel.
package s3test

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/storage/blob"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/blob/s3server"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

// Server is a running versitygw.
type Server struct{ *s3server.Server }

var (
	once    sync.Once
	shared  *Server
	sharedE error
)

// Main runs the package's tests and then stops the shared server, if one was started:
//
//	func TestMain(m *testing.M) { s3test.Main(m) }
//
// Without it the server dies with the test process (it is started with a parent-death
// signal) but its temporary directory stays.
func Main(m *testing.M) {
	code := m.Run()
	if shared != nil {
		shared.Stop()
	}
	os.Exit(code)
}

// Find returns the versitygw binary's path: PATH first, then $GOPATH/bin.
func Find() (string, error) { return s3server.Find() }

// Shared returns the process's server, starting it on first use.
func Shared(t testing.TB) *Server {
	t.Helper()
	once.Do(func() {
		var s *s3server.Server
		if s, sharedE = s3server.Start(); sharedE == nil {
			shared = &Server{s}
		}
	})
	if sharedE != nil {
		if errors.Is(sharedE, s3server.ErrNoBinary) {
			ci.Missing(t, sharedE.Error())
		}
		t.Fatalf("s3test: %v", sharedE)
	}
	return shared
}

// NewBucket creates a bucket of the test's own and removes it (with what is left in it)
// when the test ends.
func (s *Server) NewBucket(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name, err := s.MakeBucket(ctx)
	if err != nil {
		t.Fatalf("s3test: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		s.RemoveBucket(ctx, name)
	})
	return name
}

// NewDriver returns an S3 driver on a fresh bucket of the shared server.
func NewDriver(t testing.TB) *blob.S3 {
	t.Helper()
	s := Shared(t)
	d, err := blob.NewS3(s.Config(s.NewBucket(t)))
	if err != nil {
		t.Fatalf("s3test: %v", err)
	}
	return d
}
