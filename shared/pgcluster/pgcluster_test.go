package pgcluster

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

// clusterDir is a fresh directory the postgres OS user can reach (t.TempDir's
// parents are private to us).
func clusterDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pgcluster-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func TestStartStop(t *testing.T) {
	_, err := BinDir()
	ci.SkipUnlessAvailable(t, "PostgreSQL binaries", err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := clusterDir(t)

	c, err := Start(ctx, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	if err := Ping(ctx, c.URL()); err != nil {
		t.Fatalf("ping %s: %v", c.URL(), err)
	}
	if u, ok := Discover(ctx, c.URL()); !ok || u != c.URL() {
		t.Errorf("Discover(%s) = %q, %v", c.URL(), u, ok)
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := Ping(ctx, c.URL()); err == nil {
		t.Fatal("server still answers after Stop")
	}

	// The directory now holds a cluster: Start reuses it, here on a given port.
	port := c.Port()
	c2, err := Start(ctx, dir, Options{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Stop()
	if c2.Port() != port {
		t.Errorf("port = %d, want %d", c2.Port(), port)
	}
	if err := Ping(ctx, c2.URL()); err != nil {
		t.Fatalf("ping restarted cluster: %v", err)
	}
}

func TestStartReportsFailure(t *testing.T) {
	// Start fails before initdb runs when no PostgreSQL is installed at all, so the
	// failure checked here would not be initdb's.
	_, err := BinDir()
	ci.SkipUnlessAvailable(t, "PostgreSQL binaries", err)
	// A BinDir without PostgreSQL in it fails with initdb's error, not a hang.
	_, err = Start(context.Background(), clusterDir(t), Options{BinDir: t.TempDir()})
	if err == nil {
		t.Fatal("Start with an empty BinDir succeeded")
	}
}

func TestDiscover(t *testing.T) {
	ctx := context.Background()
	// A closed port is not discovered, and the probe does not hang: the deadline is far
	// past what a refused connection takes, so only a probe that waits for an answer
	// that never comes fails it, not a slow machine.
	type found struct {
		url string
		ok  bool
	}
	done := make(chan found, 1)
	go func() {
		u, ok := Discover(ctx, "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable")
		done <- found{u, ok}
	}()
	select {
	case f := <-done:
		if f.ok {
			t.Errorf("Discover on a closed port = %q, true", f.url)
		}
	case <-time.After(time.Minute):
		t.Fatal("Discover on a closed port hangs")
	}
	// With no candidates it tries the local server.
	if Ping(ctx, DefaultURL) == nil {
		if u, ok := Discover(ctx, ""); !ok || u != DefaultURL {
			t.Errorf("Discover() = %q, %v; want the local server", u, ok)
		}
	}
}
