package allocations

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/allocationsdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/lifecycle"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
)

// The events that stop running allocations: a budget in suspend mode reached 100 %
// (budgets), or a wallet's runway fell under the floor (billing). Their types are the
// producers'; they are repeated here so this package does not import their internals.
const (
	EventBudgetSuspendRequested = "budget.suspend_requested"
	EventRunwayExhausted        = "billing.runway_exhausted"
)

// DefaultStopConsumer prefixes the durable consumers' names: every replica binds the
// same consumers, so each event is handled by one of them (and again only on
// redelivery). One consumer per event type ("<prefix>-budget-suspend-requested",
// "<prefix>-runway-exhausted"): a single consumer filtered on both subjects needs
// nats-server 2.10+, and NATS_URL may point at an older one.
const DefaultStopConsumer = "allocations-stop"

// stopEvents are the event types the consumers read, with their consumers' suffixes.
var stopEvents = []struct{ eventType, suffix string }{
	{EventBudgetSuspendRequested, "-budget-suspend-requested"},
	{EventRunwayExhausted, "-runway-exhausted"},
}

// StopRequest asks for the running allocations of a scope to stop.
type StopRequest struct {
	// EventID makes the request idempotent (the outbox event id, Nats-Msg-Id): an
	// event applied once is not applied again. uuid.Nil: no dedupe.
	EventID   uuid.UUID
	EventType string
	TenantID  uuid.UUID
	ProjectID uuid.NullUUID // only this project (a project budget); else the whole tenant
	Currency  string        // only allocations billed in it (a wallet); "" any
	Reason    string        // status reason of every move
}

// StopResult says what a stop request did.
type StopResult struct {
	Stopped  int  // running allocations moved to stopped
	Released int  // allocations still being set up moved to releasing
	Repeat   bool // the event had been applied already: nothing done
}

// ApplyStopRequest stops every running allocation in r's scope (active, idle,
// restarting, restart_failed → stopped: billing closes, a stop task goes to the agent,
// release stays possible) and releases the ones still being set up (requested,
// provisioning), which cannot be stopped and would otherwise start billing once the
// agent reports them up. Each allocation moves in its own transaction (actor system,
// reason r.Reason), so one busy row never holds up the rest, and a move that the
// lifecycle refuses because the allocation changed meanwhile (released by its user, say)
// is skipped. The event is recorded last: a request that failed half-way is retried
// whole on redelivery, the done part being repeats that write nothing.
func (s *Service) ApplyStopRequest(ctx context.Context, r StopRequest) (StopResult, error) {
	var res StopResult
	q := s.read(ctx)
	if r.EventID != uuid.Nil {
		done, err := q.StopRequestApplied(ctx, r.EventID)
		if err != nil {
			return res, fmt.Errorf("stop request applied: %w", err)
		}
		if done {
			return StopResult{Repeat: true}, nil
		}
	}
	var currency *string
	if r.Currency != "" {
		currency = &r.Currency
	}
	rows, err := q.StopScope(ctx, allocationsdb.StopScopeParams{TenantID: r.TenantID, ProjectID: r.ProjectID, Currency: currency})
	if err != nil {
		return res, fmt.Errorf("stop scope: %w", err)
	}
	actor := Actor{Type: ActorSystem}
	for _, row := range rows {
		ev := lifecycle.Stop
		if st := lifecycle.Status(row.Status); st == lifecycle.Requested || st == lifecycle.Provisioning {
			ev = lifecycle.Release
		}
		_, out, err := s.applyWith(ctx, row.ID, nil, ev, actor, r.Reason, nil)
		if errors.Is(err, lifecycle.ErrForbidden) {
			continue // it moved meanwhile (released, failed, ...): nothing left to stop
		}
		if err != nil {
			return res, fmt.Errorf("stop allocation %s: %w", row.ID, err)
		}
		switch {
		case !out.Changed:
		case ev == lifecycle.Stop:
			res.Stopped++
		default:
			res.Released++
		}
	}
	if r.EventID != uuid.Nil {
		if _, err := s.read(ctx).InsertStopRequest(ctx, allocationsdb.InsertStopRequestParams{
			EventID: r.EventID, EventType: r.EventType, TenantID: r.TenantID, ProjectID: r.ProjectID, Reason: r.Reason,
			Stopped: int32(res.Stopped), Released: int32(res.Released), AppliedAt: s.now(),
		}); err != nil {
			return res, fmt.Errorf("record stop request: %w", err)
		}
	}
	return res, nil
}

// ErrBadStopEvent is an event that can never be applied (not JSON, no tenant): it is
// terminated, not redelivered.
var ErrBadStopEvent = errors.New("allocations: malformed stop event")

// StopRequestFromEvent reads a budget.suspend_requested or billing.runway_exhausted
// payload. A budget of project scope stops that project's allocations, one of tenant
// scope the tenant's; an exhausted runway stops the tenant's allocations billed in the
// wallet's currency.
func StopRequestFromEvent(eventType string, eventID uuid.UUID, payload []byte) (StopRequest, error) {
	var p struct {
		TenantID  string  `json:"tenant_id"`
		ProjectID *string `json:"project_id"`
		ScopeType string  `json:"scope_type"`
		BudgetID  string  `json:"budget_id"`
		EventID   string  `json:"event_id"`
		Currency  string  `json:"currency"`
	}
	if err := json.Unmarshal(payload, &p); err != nil {
		return StopRequest{}, fmt.Errorf("%w: %v", ErrBadStopEvent, err)
	}
	tenant, err := uuid.Parse(p.TenantID)
	if err != nil {
		return StopRequest{}, fmt.Errorf("%w: tenant_id %q", ErrBadStopEvent, p.TenantID)
	}
	r := StopRequest{EventID: eventID, EventType: eventType, TenantID: tenant}
	switch eventType {
	case EventBudgetSuspendRequested:
		budget, err := uuid.Parse(p.BudgetID)
		if err != nil {
			return StopRequest{}, fmt.Errorf("%w: budget_id %q", ErrBadStopEvent, p.BudgetID)
		}
		r.Reason = "budget_suspend: " + budget.String()
		if p.ScopeType == "project" {
			if p.ProjectID == nil {
				return StopRequest{}, fmt.Errorf("%w: project budget without project_id", ErrBadStopEvent)
			}
			project, err := uuid.Parse(*p.ProjectID)
			if err != nil {
				return StopRequest{}, fmt.Errorf("%w: project_id %q", ErrBadStopEvent, *p.ProjectID)
			}
			r.ProjectID = uuid.NullUUID{UUID: project, Valid: true}
		}
		if r.EventID == uuid.Nil {
			// Published without the outbox's message id: the budget event is applied once.
			r.EventID, _ = uuid.Parse(p.EventID)
		}
	case EventRunwayExhausted:
		if len(p.Currency) != 3 {
			return StopRequest{}, fmt.Errorf("%w: currency %q", ErrBadStopEvent, p.Currency)
		}
		r.Reason, r.Currency = "runway_exhausted", p.Currency
	default:
		return StopRequest{}, fmt.Errorf("%w: event type %q", ErrBadStopEvent, eventType)
	}
	return r, nil
}

// StopConsumer applies stop requests from the events stream (JetStream): a durable
// pull consumer per event type, shared by every replica. A message is acked
// once applied; a failure is redelivered with backoff; a malformed one is terminated.
type StopConsumer struct {
	Svc *Service
	JS  jetstream.JetStream
	// Stream is the events stream and SubjectPrefix its subject prefix (the relay's:
	// GANTRY_EVENTS_STREAM, GANTRY_EVENTS_SUBJECT_PREFIX).
	Stream        string
	SubjectPrefix string
	// Durable names the consumer (DefaultStopConsumer when empty).
	Durable string
	Log     *slog.Logger
}

func (c *StopConsumer) stream() string {
	if c.Stream != "" {
		return c.Stream
	}
	return outbox.DefaultStream
}

func (c *StopConsumer) prefix() string {
	if c.SubjectPrefix != "" {
		return c.SubjectPrefix
	}
	return outbox.SubjectPrefix
}

func (c *StopConsumer) durable() string {
	if c.Durable != "" {
		return c.Durable
	}
	return DefaultStopConsumer
}

func (c *StopConsumer) log() *slog.Logger {
	if c.Log != nil {
		return c.Log
	}
	return c.Svc.Log
}

// Ensure creates or updates the durable consumers. They start at the events published
// from their creation on (DeliverNew): events older than the first deployment are not
// replayed, since a runway exhausted days ago may have been restored since; once they
// exist their position survives restarts, so nothing published later is missed.
func (c *StopConsumer) Ensure(ctx context.Context) ([]jetstream.Consumer, error) {
	var out []jetstream.Consumer
	for _, e := range stopEvents {
		cons, err := c.JS.CreateOrUpdateConsumer(ctx, c.stream(), jetstream.ConsumerConfig{
			Durable:       c.durable() + e.suffix,
			Description:   "allocations: stop running allocations on " + e.eventType,
			FilterSubject: c.prefix() + e.eventType,
			DeliverPolicy: jetstream.DeliverNewPolicy,
			AckPolicy:     jetstream.AckExplicitPolicy,
			// Stopping a large tenant's allocations takes a while; the handler reports
			// progress, so this only matters for a replica that died mid-way.
			AckWait:       2 * time.Minute,
			MaxAckPending: 64,
		})
		if err != nil {
			return nil, fmt.Errorf("stop consumer for %s: %w", e.eventType, err)
		}
		out = append(out, cons)
	}
	return out, nil
}

// Run consumes until ctx ends. The events stream may not exist yet when the replica
// starts (the relay creates it), so ensuring the consumers is retried.
func (c *StopConsumer) Run(ctx context.Context) error {
	var consumers []jetstream.Consumer
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		var err error
		if consumers, err = c.Ensure(ctx); err == nil {
			break
		}
		c.log().WarnContext(ctx, "stop consumers not ready", "stream", c.stream(), "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	var running []jetstream.ConsumeContext
	defer func() {
		for _, cc := range running {
			cc.Stop()
		}
	}()
	for _, cons := range consumers {
		cc, err := cons.Consume(func(msg jetstream.Msg) { c.handle(ctx, msg) },
			jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
				if ctx.Err() == nil {
					c.log().WarnContext(ctx, "stop consumer", "err", err)
				}
			}))
		if err != nil {
			return fmt.Errorf("consume stop events: %w", err)
		}
		running = append(running, cc)
	}
	<-ctx.Done()
	return nil
}

// handle applies one message and acknowledges it.
func (c *StopConsumer) handle(ctx context.Context, msg jetstream.Msg) {
	typ := msg.Headers().Get("Gantry-Event-Type")
	if typ == "" {
		typ = strings.TrimPrefix(msg.Subject(), c.prefix())
	}
	id, _ := uuid.Parse(msg.Headers().Get(jetstream.MsgIDHeader))
	req, err := StopRequestFromEvent(typ, id, msg.Data())
	if err != nil {
		c.log().ErrorContext(ctx, "stop event dropped", "subject", msg.Subject(), "err", err)
		_ = msg.Term()
		return
	}
	// Keep the message ours while a long request runs.
	stopProgress := make(chan struct{})
	defer close(stopProgress)
	go func() {
		t := time.NewTicker(30 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stopProgress:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	res, err := c.Svc.ApplyStopRequest(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			return // shutting down: redelivered to whichever replica is left
		}
		n := uint64(1)
		if md, mErr := msg.Metadata(); mErr == nil {
			n = md.NumDelivered
		}
		c.log().WarnContext(ctx, "stop request failed; will retry", "event_type", typ, "tenant_id", req.TenantID, "attempt", n, "err", err)
		_ = msg.NakWithDelay(min(time.Duration(n)*5*time.Second, 2*time.Minute))
		return
	}
	c.log().InfoContext(ctx, "stop request applied", "event_type", typ, "tenant_id", req.TenantID,
		"stopped", res.Stopped, "released", res.Released, "repeat", res.Repeat)
	if err := msg.Ack(); err != nil {
		c.log().WarnContext(ctx, "stop event ack failed (it will be redelivered and deduplicated)", "err", err)
	}
}
