package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-gpu/gantry/controlplane/internal/outbox/outboxdb"
	"github.com/gantry-gpu/gantry/shared/clock"
)

// DefaultStream holds every domain event.
const (
	DefaultStream  = "GANTRY_EVENTS"
	SubjectPrefix  = "gantry.events."
	defaultBatch   = 100
	defaultIdle    = 5 * time.Second
	maxErrorLength = 500
)

// Relay publishes pending outbox events to JetStream.
type Relay struct {
	Pool   *pgxpool.Pool
	JS     jetstream.JetStream
	Clock  clock.Clock
	Logger *slog.Logger
	// Stream is the JetStream stream the relay makes sure exists (subjects
	// SubjectPrefix + ">"); tests give each package its own name and prefix.
	Stream        string
	SubjectPrefix string
	Batch         int
	// Idle is the longest the relay sleeps without a notification; it bounds the delay
	// when a NOTIFY is lost (for example across a database failover).
	Idle time.Duration
	// Routes map stored subjects outside the events prefix onto other streams' subjects
	// (e.g. "gantry.provisioning." onto the PROVISIONING stream's prefix). The owner of
	// each such stream must create it before the relay runs: a publish with no stream
	// behind it fails, and the relay keeps order by stopping at the first failure.
	Routes []Route
}

// Route maps stored subjects starting with From onto To.
type Route struct{ From, To string }

// EnsureStream creates or updates the events stream.
func (r *Relay) EnsureStream(ctx context.Context) error {
	_, err := r.JS.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:       r.stream(),
		Subjects:   []string{r.prefix() + ">"},
		Storage:    jetstream.FileStorage,
		Duplicates: 10 * time.Minute,
		MaxAge:     7 * 24 * time.Hour,
	})
	if err != nil {
		return fmt.Errorf("ensure stream %s: %w", r.stream(), err)
	}
	return nil
}

// Run publishes until ctx ends, woken by the outbox_events NOTIFY of each insert.
func (r *Relay) Run(ctx context.Context) error {
	if err := r.EnsureStream(ctx); err != nil {
		return err
	}
	for ctx.Err() == nil {
		if err := r.listen(ctx); err != nil && ctx.Err() == nil {
			r.Logger.WarnContext(ctx, "outbox relay listener failed; retrying", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

func (r *Relay) listen(ctx context.Context) error {
	conn, err := r.Pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN outbox_events"); err != nil {
		return err
	}
	for {
		if _, err := r.Drain(ctx); err != nil {
			r.Logger.WarnContext(ctx, "outbox publish failed", "err", err)
		}
		waitCtx, cancel := context.WithTimeout(ctx, r.idle())
		_, err := conn.Conn().WaitForNotification(waitCtx)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
	}
}

// Drain publishes pending events batch by batch until none is left, and returns how
// many it published.
func (r *Relay) Drain(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := r.publishBatch(ctx)
		total += n
		if err != nil || n < r.batch() {
			return total, err
		}
	}
}

func (r *Relay) publishBatch(ctx context.Context) (int, error) {
	tx, err := r.Pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	q := outboxdb.New(tx)
	rows, err := q.ClaimPendingOutboxEvents(ctx, int32(r.batch()))
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	// The events published are marked in one statement at the end of the batch: they
	// stay locked until the commit either way, so nothing else sees them meanwhile.
	done := make([]uuid.UUID, 0, len(rows))
	var firstErr error
	for _, ev := range rows {
		if err := r.publish(ctx, ev); err != nil {
			msg := err.Error()
			if len(msg) > maxErrorLength {
				msg = msg[:maxErrorLength]
			}
			if mErr := q.MarkOutboxEventFailed(ctx, outboxdb.MarkOutboxEventFailedParams{ID: ev.ID, LastError: &msg}); mErr != nil {
				return 0, mErr
			}
			firstErr = err
			// Keep order per relay: stop at the first failure, retry on the next wake.
			break
		}
		done = append(done, ev.ID)
	}
	published := len(done)
	if published > 0 {
		if err := q.MarkOutboxEventsPublished(ctx, outboxdb.MarkOutboxEventsPublishedParams{Ids: done, PublishedAt: timePtr(r.Clock.Now())}); err != nil {
			return 0, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	if firstErr != nil {
		return published, firstErr
	}
	return published, nil
}

func (r *Relay) publish(ctx context.Context, ev outboxdb.ClaimPendingOutboxEventsRow) error {
	msg := nats.NewMsg(r.subject(ev.Subject))
	msg.Data = ev.Payload
	var hdr map[string]string
	if err := json.Unmarshal(ev.Headers, &hdr); err == nil {
		for k, v := range hdr {
			msg.Header.Set(k, v)
		}
	}
	msg.Header.Set("Gantry-Event-Type", ev.EventType)
	pubCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// The event id as Nats-Msg-Id makes a re-publish after a crash a no-op in the stream.
	_, err := r.JS.PublishMsg(pubCtx, msg, jetstream.WithMsgID(ev.ID.String()))
	return err
}

// subject maps the stored subject (gantry.events.<type>) onto this relay's prefix.
func (r *Relay) subject(stored string) string {
	for _, rt := range r.Routes {
		if rest, ok := strings.CutPrefix(stored, rt.From); ok {
			return rt.To + rest
		}
	}
	if r.prefix() == SubjectPrefix {
		return stored
	}
	if len(stored) > len(SubjectPrefix) && stored[:len(SubjectPrefix)] == SubjectPrefix {
		return r.prefix() + stored[len(SubjectPrefix):]
	}
	return r.prefix() + stored
}

func (r *Relay) stream() string {
	if r.Stream != "" {
		return r.Stream
	}
	return DefaultStream
}

func (r *Relay) prefix() string {
	if r.SubjectPrefix != "" {
		return r.SubjectPrefix
	}
	return SubjectPrefix
}

func (r *Relay) batch() int {
	if r.Batch > 0 {
		return r.Batch
	}
	return defaultBatch
}

func (r *Relay) idle() time.Duration {
	if r.Idle > 0 {
		return r.Idle
	}
	return defaultIdle
}

func timePtr(t time.Time) *time.Time { return &t }

// PublishedRetention is how long published events stay in the outbox table (for
// inspection) before Prune removes them; JetStream keeps its own copy.
const PublishedRetention = 7 * 24 * time.Hour

// Prune deletes events published more than PublishedRetention ago and returns how many.
// Pending events are never touched.
func (r *Relay) Prune(ctx context.Context) (int64, error) {
	return outboxdb.New(r.Pool).DeletePublishedOutboxEventsBefore(ctx, timePtr(r.Clock.Now().Add(-PublishedRetention)))
}
