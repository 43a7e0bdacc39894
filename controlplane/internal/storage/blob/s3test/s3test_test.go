package s3test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"
)

// TestFind: the binary is found in $GOPATH/bin when it is not on PATH (where `go install`
// puts it in CI), and a missing one is an error that says how to install it.
func TestFind(t *testing.T) {
	gopath := t.TempDir()
	t.Setenv("PATH", t.TempDir())
	t.Setenv("GOPATH", gopath)
	if p, err := Find(); err == nil {
		t.Fatalf("Find with no binary anywhere = %q", p)
	} else if !strings.Contains(err.Error(), "go install github.com/versity/versitygw/cmd/versitygw@v1.8.0") {
		t.Fatalf("the error does not say how to install it: %v", err)
	}
	bin := filepath.Join(gopath, "bin", "versitygw")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if p, err := Find(); err != nil || p != bin {
		t.Fatalf("Find = %q, %v; want %q", p, err, bin)
	}
}

// TestServer starts the real server and uses it through the blob driver the helper
// configures: a bucket per caller, objects visible to a second client.
func TestServer(t *testing.T) {
	s := Shared(t)
	if Shared(t) != s {
		t.Fatal("Shared started a second server")
	}
	d := NewDriver(t)
	other := NewDriver(t)
	if d.Bucket() == other.Bucket() {
		t.Fatal("two drivers share a bucket")
	}
	ctx := t.Context()
	if _, err := d.Put(ctx, "k/v", strings.NewReader("hello"), 5); err != nil {
		t.Fatal(err)
	}
	oi, err := s.Client().StatObject(ctx, d.Bucket(), "k/v", minio.StatObjectOptions{})
	if err != nil || oi.Size != 5 {
		t.Fatalf("the object is not on the server: %+v, %v", oi, err)
	}
	if _, err := other.Stat(ctx, "k/v"); err == nil {
		t.Fatal("an object of one bucket is visible in another")
	}
}

func TestMain(m *testing.M) { Main(m) }
