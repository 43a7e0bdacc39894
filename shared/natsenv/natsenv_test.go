package natsenv

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestEmbeddedJetStream(t *testing.T) {
	s, err := Embedded(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	url := s.URL()
	if !Reachable(url) || !HasJetStream(url) {
		t.Fatalf("embedded server at %s not reachable with JetStream", url)
	}

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := js.Publish(ctx, "events.x", []byte("hello")); err != nil {
			t.Fatal(err)
		}
	}
	st, err := js.Stream(ctx, "EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 3 {
		t.Errorf("stream has %d messages, want 3", info.State.Msgs)
	}
	nc.Close()

	s.Shutdown()
	s.Shutdown() // idempotent
	if Reachable(url) {
		t.Errorf("server at %s still reachable after Shutdown", url)
	}
}

// Probing a closed port answers false and does not hang. The deadline is far past what
// a refused connection takes, so a slow machine cannot fail it; only a probe that waits
// for something that never comes does.
func TestReachableNothingThere(t *testing.T) {
	done := make(chan bool, 1)
	go func() { done <- Reachable("nats://127.0.0.1:1") || HasJetStream("nats://127.0.0.1:1") }()
	select {
	case up := <-done:
		if up {
			t.Error("Reachable on a closed port")
		}
	case <-time.After(time.Minute):
		t.Fatal("probing a closed port hangs")
	}
}
