// Package outbox owns the transactional outbox: Enqueue writes a domain event with the
// transaction of the change that causes it; the Relay publishes pending events to NATS
// JetStream with the event id as Nats-Msg-Id (broker-side dedupe). Payloads carry
// identifiers only; Enqueue refuses payload fields that look like secrets.
package outbox

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/outbox/outboxdb"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/correlation"
	"github.com/gantry-gpu/gantry/shared/ids"
	"github.com/gantry-gpu/gantry/shared/redact"
)

// Event is a domain event to publish.
type Event struct {
	Type    string // e.g. "project.created"
	Subject string // NATS subject, e.g. "gantry.events.project.created"
	Payload map[string]any
}

// Writer enqueues events.
type Writer struct {
	Clock clock.Clock
	IDs   ids.Source
}

// Enqueue stores ev with tx and returns its id. The request's correlation id and trace
// context travel as message headers.
func (w *Writer) Enqueue(ctx context.Context, tx pgx.Tx, ev Event) (uuid.UUID, error) {
	if key, ok := redact.FirstSecretField(ev.Payload); ok {
		return uuid.Nil, fmt.Errorf("outbox: event %s carries secret-like field %q", ev.Type, key)
	}
	payload, err := json.Marshal(ev.Payload)
	if err != nil {
		return uuid.Nil, fmt.Errorf("outbox payload: %w", err)
	}
	headers := map[string]string{}
	correlation.Inject(ctx, func(k, v string) { headers[k] = v })
	hdrJSON, _ := json.Marshal(headers)
	id := w.IDs.New()
	err = outboxdb.New(tx).InsertOutboxEvent(ctx, outboxdb.InsertOutboxEventParams{
		ID: id, EventType: ev.Type, Subject: ev.Subject, Payload: payload, Headers: hdrJSON, CreatedAt: w.Clock.Now(),
	})
	if err != nil {
		return uuid.Nil, fmt.Errorf("outbox insert: %w", err)
	}
	return id, nil
}
