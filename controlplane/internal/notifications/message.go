package notifications

import (
	"encoding/json"
	"fmt"
	"regexp"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/shared/redact"
)

// Message is what a client receives, one JSON text message per notification.
type Message struct {
	Channel Channel `json:"channel"`
	// Type is the event type, e.g. "allocation.active" or "budget.threshold_crossed".
	Type string `json:"type"`
	// Data carries identifiers and statuses only, never secrets.
	Data   map[string]any `json:"data"`
	SentAt time.Time      `json:"sent_at"`
}

// Notification is a message to publish.
type Notification struct {
	Channel Channel
	Type    string
	Data    map[string]any
	// Project, when set on an organization message, limits it to the users who can see
	// that project (members, and the tenant's admins).
	Project uuid.UUID
}

// maxDataBytes caps one message's data: notifications carry identifiers, not documents.
const maxDataBytes = 16 << 10

var typePattern = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,63}$`)

// validate checks n before it is published or delivered.
func (n Notification) validate() error {
	kind, _, err := n.Channel.parse()
	if err != nil {
		return err
	}
	if !typePattern.MatchString(n.Type) {
		return fmt.Errorf("notifications: type %q is not a lower-case dotted name of at most 64 characters", n.Type)
	}
	if n.Project != uuid.Nil && kind != orgKind {
		return fmt.Errorf("notifications: only organization messages are limited to a project")
	}
	if key, ok := redact.FirstSecretField(map[string]any(n.Data)); ok {
		return fmt.Errorf("notifications: %s carries secret-like field %q", n.Type, key)
	}
	return nil
}

// encode is the JSON a client receives for n, sent at at.
func (n Notification) encode(at time.Time) ([]byte, error) {
	data := n.Data
	if data == nil {
		data = map[string]any{}
	}
	b, err := json.Marshal(Message{Channel: n.Channel, Type: n.Type, Data: data, SentAt: at.UTC()})
	if err != nil {
		return nil, fmt.Errorf("notifications: encode %s: %w", n.Type, err)
	}
	if len(b) > maxDataBytes {
		return nil, fmt.Errorf("notifications: %s is %d bytes, more than %d", n.Type, len(b), maxDataBytes)
	}
	return b, nil
}
