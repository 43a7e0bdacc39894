// Package s3server runs a real S3 API server, versitygw v1.8.0 (STACK.md), over a
// temporary directory on a free loopback port: for the tests (through s3test) and for
// gantry-bench's storage section, which must not depend on package testing. The binary
// is found on PATH or in $(go env GOPATH)/bin, where .ci/run installs it with
// `go install`; a missing one is ErrNoBinary, which says how to install it.
package s3server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/gantry-gpu/gantry/controlplane/internal/storage/blob"
)

const (
	binary    = "versitygw"
	accessKey = "gantrytest"
	secretKey = "gantrytest-secret-key"
	// startTimeout covers a cold start on a loaded two-core machine.
	startTimeout = 60 * time.Second
)

// ErrNoBinary: versitygw is neither on PATH nor in $GOPATH/bin.
var ErrNoBinary = errors.New("S3 test server")

// Server is a running versitygw.
type Server struct {
	// Endpoint is host:port (plain HTTP).
	Endpoint  string
	AccessKey string
	SecretKey string

	cmd    *exec.Cmd
	dir    string
	log    *lockedWriter
	client *minio.Client
	// exited is closed once the process has been waited for; waitErr is then its exit.
	exited  chan struct{}
	waitErr error
}

// Find returns the versitygw binary's path: PATH first, then $GOPATH/bin.
func Find() (string, error) {
	if p, err := exec.LookPath(binary); err == nil {
		return p, nil
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
			gopath = string(bytes.TrimSpace(out))
		}
	}
	if gopath == "" {
		if home, err := os.UserHomeDir(); err == nil {
			gopath = filepath.Join(home, "go")
		}
	}
	for _, dir := range filepath.SplitList(gopath) {
		p := filepath.Join(dir, "bin", binary)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not on PATH nor in $GOPATH/bin (go install github.com/versity/versitygw/cmd/versitygw@v1.8.0)", binary)
}

// Start starts a server and waits until its S3 API answers. Stop ends it and removes
// its directory; should the caller die first, the server dies with it (parent-death
// signal) but the directory stays.
func Start() (*Server, error) {
	bin, err := Find()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoBinary, err)
	}
	dir, err := os.MkdirTemp("", "gantry-s3test-")
	if err != nil {
		return nil, err
	}
	// A port is picked by binding :0 and released for the server; a race with another
	// process taking it in between is retried with a new port.
	var lastErr error
	for range 3 {
		port, err := freePort()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		s := &Server{
			Endpoint:  fmt.Sprintf("127.0.0.1:%d", port),
			AccessKey: accessKey,
			SecretKey: secretKey,
			dir:       dir,
			log:       &lockedWriter{},
			exited:    make(chan struct{}),
		}
		s.cmd = exec.Command(bin, "--access", accessKey, "--secret", secretKey, "--port", s.Endpoint, "--quiet", "posix", dir)
		s.cmd.Stdout = s.log
		s.cmd.Stderr = s.cmd.Stdout
		if runtime.GOOS == "linux" {
			s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		}
		if err := s.cmd.Start(); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("start %s: %w", bin, err)
		}
		go func() { s.waitErr = s.cmd.Wait(); close(s.exited) }()
		s.client, err = minio.New(s.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(accessKey, secretKey, "")})
		if err != nil {
			s.kill()
			os.RemoveAll(dir)
			return nil, err
		}
		if lastErr = s.waitReady(); lastErr == nil {
			return s, nil
		}
		s.kill()
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

// waitReady polls the S3 API itself (ListBuckets, signed) until it answers.
func (s *Server) waitReady() error {
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			return fmt.Errorf("versitygw exited (%v): %s", s.waitErr, s.log.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := s.client.ListBuckets(ctx)
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("versitygw not ready after %s: %s", startTimeout, s.log.String())
}

func (s *Server) kill() {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// Stop ends the server (SIGTERM, then SIGKILL after 10 s) and removes its directory.
func (s *Server) Stop() {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(10 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
	os.RemoveAll(s.dir)
}

// Pid is the server process's id (a benchmark reads its CPU time from /proc).
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Client is a minio-go client for the server, for checks made behind a driver.
func (s *Server) Client() *minio.Client { return s.client }

// MakeBucket creates a bucket with a fresh random name and returns the name.
func (s *Server) MakeBucket(ctx context.Context) (string, error) {
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	name := "gantry-test-" + hex.EncodeToString(rnd[:])
	if err := s.client.MakeBucket(ctx, name, minio.MakeBucketOptions{}); err != nil {
		return "", fmt.Errorf("s3server: make bucket: %w", err)
	}
	return name, nil
}

// RemoveBucket removes a bucket and whatever is left in it, unfinished multipart
// uploads included.
func (s *Server) RemoveBucket(ctx context.Context, name string) {
	_ = s.client.RemoveBucketWithOptions(ctx, name, minio.RemoveBucketOptions{ForceDelete: true})
	// versitygw's posix backend may not support ForceDelete: empty it by hand too.
	for o := range s.client.ListObjects(ctx, name, minio.ListObjectsOptions{Recursive: true}) {
		if o.Err == nil {
			_ = s.client.RemoveObject(ctx, name, o.Key, minio.RemoveObjectOptions{})
		}
	}
	for u := range s.client.ListIncompleteUploads(ctx, name, "", true) {
		if u.Err == nil {
			_ = s.client.RemoveIncompleteUpload(ctx, name, u.Key)
		}
	}
	_ = s.client.RemoveBucket(ctx, name)
}

// Config is the driver configuration for bucket on this server.
func (s *Server) Config(bucket string) blob.S3Config {
	return blob.S3Config{
		Endpoint:  s.Endpoint,
		Bucket:    bucket,
		AccessKey: s.AccessKey,
		SecretKey: s.SecretKey,
		Insecure:  true,
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// lockedWriter keeps the server's output for the error that explains a failed start.
type lockedWriter struct {
	mu sync.Mutex
	w  bytes.Buffer
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.String()
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w.Len() > 1<<20 {
		return len(p), nil // enough to explain a failure; never grow without bound
	}
	return l.w.Write(p)
}
