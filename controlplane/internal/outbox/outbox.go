// Package outbox owns the transactional outbox: Enqueue writes a domain event with the
// transaction of the change that causes it; the Relay publishes pending events to NATS
// JetStream with the event id as Nats-Msg-Id (broker-side dedupe). Payloads carry
// identifiers only; Enqueue refuses payload fields that look like secrets.
package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/outbox/outboxdb"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/correlation"
	"github.com/gantry-gpu/gantry/shared/ids"
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
	if key, ok := secretField(ev.Payload); ok {
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

// secretMarkers are substrings of field names that never belong in an event.
var secretMarkers = []string{"token", "secret", "password", "private_key", "privatekey", "authorization", "credential", "api_key", "apikey"}

// IsSecretField reports whether a JSON field name looks like it holds a secret.
func IsSecretField(name string) bool {
	n := strings.ToLower(name)
	for _, m := range secretMarkers {
		if strings.Contains(n, m) {
			return true
		}
	}
	return false
}

func secretField(v any) (string, bool) {
	switch t := v.(type) {
	case map[string]any:
		for k, inner := range t {
			if IsSecretField(k) {
				return k, true
			}
			if key, ok := secretField(inner); ok {
				return key, true
			}
		}
	case []any:
		for _, inner := range t {
			if key, ok := secretField(inner); ok {
				return key, true
			}
		}
	}
	return "", false
}
