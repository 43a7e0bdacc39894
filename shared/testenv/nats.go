package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-gpu/gantry/shared/natsenv"
)

var natsURL once[string]

// NATS returns the URL of a NATS server with JetStream for tests: NATS_URL
// when set; else nats://127.0.0.1:4222 when it answers with JetStream; else an
// embedded server started once per test process (stopped by Main). Servers
// may be shared between packages: name streams and buckets with Namespace.
func NATS(t testing.TB) string {
	t.Helper()
	u, err := natsURL.get(findNATS)
	if err != nil {
		fail(t, err)
	}
	return u
}

func findNATS() (string, error) {
	if u := os.Getenv("NATS_URL"); u != "" {
		if !natsenv.HasJetStream(u) {
			return "", misconfigured{fmt.Errorf("NATS_URL=%s is set but does not answer with JetStream", u)}
		}
		return u, nil
	}
	if natsenv.HasJetStream(localNATS) {
		return localNATS, nil
	}
	dir, err := os.MkdirTemp("", "gantry-testenv-nats-")
	if err != nil {
		return "", err
	}
	s, err := natsenv.Embedded(dir)
	if err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("no NATS: NATS_URL unset, no JetStream at %s, and an embedded server failed: %w", localNATS, err)
	}
	onExit(func() {
		s.Shutdown()
		os.RemoveAll(dir)
	})
	return s.URL(), nil
}

// CleanupStreams deletes the named streams when the test ends; streams that
// do not exist are ignored. js must still be usable then (register this after
// the connection's own cleanup, so it runs first).
func CleanupStreams(t testing.TB, js jetstream.JetStream, names ...string) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, n := range names {
			if err := js.DeleteStream(ctx, n); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				t.Errorf("testenv: delete stream %s: %v", n, err)
			}
		}
	})
}

// CleanupKV deletes the named key-value buckets when the test ends, like
// CleanupStreams.
func CleanupKV(t testing.TB, js jetstream.JetStream, buckets ...string) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, b := range buckets {
			if err := js.DeleteKeyValue(ctx, b); err != nil &&
				!errors.Is(err, jetstream.ErrBucketNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
				t.Errorf("testenv: delete KV bucket %s: %v", b, err)
			}
		}
	})
}
