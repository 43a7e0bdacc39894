package provisioning

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// EnsureStream creates or updates the provisioning stream. It must exist before the
// outbox relay publishes: the relay keeps order by stopping at the first event it
// cannot publish, so a missing stream would hold every event behind a dispatch message.
//
// Retention is WorkQueue: a message is removed once a dispatcher acknowledged it, so the
// stream holds exactly the undelivered work (its size is the queue), and JetStream
// refuses a second consumer over the same subjects, which could only mean a second
// delivery of every task. Nothing else reads these messages: what happened to a task is
// in allocation_tasks and the allocation's events, and the domain events go to the
// events stream. File storage, so queued tasks survive a NATS restart; the Nats-Msg-Id
// window lets the relay re-publish after a crash without a second message.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	cfg = cfg.withDefaults()
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        cfg.Stream,
		Description: "Gantry provisioning dispatch: allocation tasks for node agents (docs/provisioning.md)",
		Subjects:    []string{cfg.SubjectPrefix + ">"},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Duplicates:  DuplicateWindow,
		MaxAge:      MaxAge,
	})
	if err != nil {
		return fmt.Errorf("ensure stream %s: %w", cfg.Stream, err)
	}
	return nil
}

// consumerConfig is the durable consumer every replica shares.
func consumerConfig(cfg Config) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       cfg.Consumer,
		Description:   "provisioning dispatcher (every control-plane replica)",
		FilterSubject: cfg.Subject(),
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait,
		MaxAckPending: cfg.MaxAckPending,
		// Unbounded: the task's deadline, not a delivery count, ends the retries (a
		// message past it fails its allocation and is acknowledged).
		MaxDeliver: -1,
	}
}
