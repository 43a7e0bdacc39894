package notifications

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/correlation"
)

// headerProject carries Notification.Project on the NATS message (not in the body: the
// body is exactly what clients receive).
const headerProject = "Gantry-Project-Id"

// Publisher sends notifications to every replica over NATS; each replica's Hub delivers
// them to its own connections. Fire and forget: nothing is stored, and a message with
// nobody subscribed is gone.
type Publisher struct {
	NATS *nats.Conn
	// Prefix is the notification subject prefix, e.g. "gantry.notifications.".
	Prefix string
	Clock  clock.Clock
}

// Publish sends n. It refuses an unknown channel, a malformed type, a project on a
// non-organization channel and data with secret-like fields.
func (p *Publisher) Publish(ctx context.Context, n Notification) error {
	if err := n.validate(); err != nil {
		return err
	}
	subject, err := n.Channel.subject(p.Prefix)
	if err != nil {
		return err
	}
	body, err := n.encode(p.Clock.Now())
	if err != nil {
		return err
	}
	msg := nats.NewMsg(subject)
	msg.Data = body
	if n.Project != uuid.Nil {
		msg.Header.Set(headerProject, n.Project.String())
	}
	correlation.Inject(ctx, func(k, v string) { msg.Header.Set(k, v) })
	if err := p.NATS.PublishMsg(msg); err != nil {
		return fmt.Errorf("notifications: publish %s: %w", n.Type, err)
	}
	return nil
}

// Broadcast sends a platform message to every connected user.
func (p *Publisher) Broadcast(ctx context.Context, typ string, data map[string]any) error {
	return p.Publish(ctx, Notification{Channel: Broadcast(), Type: typ, Data: data})
}

// User sends a message to every connection of one user.
func (p *Publisher) User(ctx context.Context, userID uuid.UUID, typ string, data map[string]any) error {
	return p.Publish(ctx, Notification{Channel: UserChannel(userID), Type: typ, Data: data})
}
