package loop

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestEveryRunsPassesLogsFailuresAndStops(t *testing.T) {
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	// interval <= 0: never runs, returns at once.
	Every(context.Background(), 0, log, "never", func(context.Context) error {
		t.Error("a pass ran with interval 0")
		return nil
	})

	ctx, cancel := context.WithCancel(context.Background())
	passes := make(chan int, 16)
	n := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		Every(ctx, time.Millisecond, log, "sweep", func(context.Context) error {
			n++
			passes <- n
			if n == 2 {
				return errors.New("boom")
			}
			return nil
		}, "extra", "attr")
	}()
	for got := range passes {
		if got == 3 {
			break
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Every did not return after its context ended")
	}
	out := logs.String()
	if strings.Count(out, "sweep failed") != 1 || !strings.Contains(out, "err=boom") || !strings.Contains(out, "extra=attr") {
		t.Fatalf("log = %q, want one failure with its error and attrs", out)
	}
}
