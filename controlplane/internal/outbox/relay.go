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

// PublishTimeout bounds the relay's wait for a batch's acknowledgements. The JetStream
// context the relay publishes with should time its asynchronous publishes out after it
// too (jetstream.WithPublishAsyncTimeout), so that one whose acknowledgement was lost
// does not stay pending in it for good.
const PublishTimeout = 5 * time.Second

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
	failed, firstErr := r.publishAll(ctx, rows, func(id uuid.UUID) { done = append(done, id) })
	if firstErr != nil {
		msg := firstErr.Error()
		if len(msg) > maxErrorLength {
			msg = msg[:maxErrorLength]
		}
		if mErr := q.MarkOutboxEventFailed(ctx, outboxdb.MarkOutboxEventFailedParams{ID: failed, LastError: &msg}); mErr != nil {
			return 0, mErr
		}
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

// publishAll publishes rows in their order, all sent before the first acknowledgement is
// awaited (one round trip to the server for the batch instead of one per event), and
// calls published with each event the stream acknowledged, in order, up to the first
// that failed, which it returns with its error. The events sent behind a failed one are
// not counted as published even when the stream took them: they are published again
// with the rest (their Nats-Msg-Id makes that a no-op in the stream), so such an event
// may sit in the stream before the failed one once that one gets through.
func (r *Relay) publishAll(ctx context.Context, rows []outboxdb.ClaimPendingOutboxEventsRow, published func(uuid.UUID)) (uuid.UUID, error) {
	pubCtx, cancel := context.WithTimeout(ctx, PublishTimeout)
	defer cancel()
	acks := make([]jetstream.PubAckFuture, 0, len(rows))
	var sendErr error
	for _, ev := range rows {
		// The event id as Nats-Msg-Id makes a re-publish after a crash a no-op in the stream.
		f, err := r.JS.PublishMsgAsync(r.message(ev), jetstream.WithMsgID(ev.ID.String()))
		if err != nil {
			sendErr = err
			break
		}
		acks = append(acks, f)
	}
	for i, f := range acks {
		select {
		case <-f.Ok():
			published(rows[i].ID)
		case err := <-f.Err():
			return rows[i].ID, err
		case <-pubCtx.Done():
			return rows[i].ID, fmt.Errorf("publish %s: %w", rows[i].ID, pubCtx.Err())
		}
	}
	if sendErr != nil {
		return rows[len(acks)].ID, sendErr
	}
	return uuid.Nil, nil
}

// message is the NATS message of a stored event: its payload, its stored headers and
// its type.
func (r *Relay) message(ev outboxdb.ClaimPendingOutboxEventsRow) *nats.Msg {
	msg := nats.NewMsg(r.subject(ev.Subject))
	msg.Data = ev.Payload
	var hdr map[string]string
	if err := json.Unmarshal(ev.Headers, &hdr); err == nil {
		for k, v := range hdr {
			msg.Header.Set(k, v)
		}
	}
	msg.Header.Set("Gantry-Event-Type", ev.EventType)
	return msg
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
