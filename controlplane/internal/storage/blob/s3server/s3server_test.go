package s3server

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

// TestStartWithoutBinary: a missing versitygw is ErrNoBinary with the install command,
// so gantry-bench can fail with a clear error instead of dropping its s3 backend.
func TestStartWithoutBinary(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv("GOPATH", t.TempDir())
	s, err := Start()
	if err == nil {
		s.Stop()
		t.Fatal("Start without a binary succeeded")
	}
	if !errors.Is(err, ErrNoBinary) || !strings.Contains(err.Error(), "go install github.com/versity/versitygw/cmd/versitygw@v1.8.0") {
		t.Fatalf("Start without a binary = %v; want ErrNoBinary saying how to install it", err)
	}
}

// TestStartStop: a started server answers the S3 API (a bucket is made and found), and
// Stop ends the process and removes its directory.
func TestStartStop(t *testing.T) {
	if _, err := Find(); err != nil {
		ci.Missing(t, err.Error())
		return
	}
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			s.Stop()
		}
	}()
	ctx := t.Context()
	name, err := s.MakeBucket(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Client().BucketExists(ctx, name); err != nil || !ok {
		t.Fatalf("bucket %s: exists %v, %v", name, ok, err)
	}
	s.RemoveBucket(ctx, name)
	if ok, err := s.Client().BucketExists(ctx, name); err != nil || ok {
		t.Fatalf("bucket %s after RemoveBucket: exists %v, %v", name, ok, err)
	}
	pid := s.Pid()
	s.Stop()
	stopped = true
	if _, err := os.Stat(s.dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the server's directory is still there: %v", err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("the server process %d is still there: %v", pid, err)
	}
}
