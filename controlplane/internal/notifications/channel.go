package notifications

import (
	"fmt"
	"strings"

	"github.com/google/uuid"
)

// Channel names where a notification goes: "user:<id>", "org:<tenant id>" or
// "broadcast". The name is also the message's "channel" field.
type Channel string

const (
	userKind      = "user"
	orgKind       = "org"
	broadcastName = "broadcast"
)

// UserChannel is the channel of one user: every connection of that user, on any replica.
func UserChannel(userID uuid.UUID) Channel { return Channel(userKind + ":" + userID.String()) }

// OrgChannel is the channel of one organization (tenant): every connection of its users.
// A message with a project (Notification.Project) reaches only those who can see it.
func OrgChannel(tenantID uuid.UUID) Channel { return Channel(orgKind + ":" + tenantID.String()) }

// Broadcast is the channel every connection is subscribed to (platform messages).
func Broadcast() Channel { return Channel(broadcastName) }

// parse splits c into its kind and id; broadcast has no id.
func (c Channel) parse() (kind string, id uuid.UUID, err error) {
	if c == broadcastName {
		return broadcastName, uuid.Nil, nil
	}
	kind, raw, ok := strings.Cut(string(c), ":")
	if !ok || (kind != userKind && kind != orgKind) {
		return "", uuid.Nil, fmt.Errorf("notifications: unknown channel %q", c)
	}
	id, err = uuid.Parse(raw)
	if err != nil || id == uuid.Nil || id.String() != raw {
		return "", uuid.Nil, fmt.Errorf("notifications: channel %q has no canonical id", c)
	}
	return kind, id, nil
}

// subject is the NATS subject of c under prefix: <prefix>user.<id>, <prefix>org.<id>,
// <prefix>broadcast.
func (c Channel) subject(prefix string) (string, error) {
	kind, id, err := c.parse()
	if err != nil {
		return "", err
	}
	if kind == broadcastName {
		return prefix + broadcastName, nil
	}
	return prefix + kind + "." + id.String(), nil
}

// channelOfSubject is the inverse of subject.
func channelOfSubject(prefix, subject string) (Channel, bool) {
	rest, ok := strings.CutPrefix(subject, prefix)
	if !ok {
		return "", false
	}
	var c Channel
	if rest == broadcastName {
		c = Broadcast()
	} else {
		kind, id, ok := strings.Cut(rest, ".")
		if !ok {
			return "", false
		}
		c = Channel(kind + ":" + id)
	}
	if _, _, err := c.parse(); err != nil {
		return "", false
	}
	return c, true
}
