// Package ids mints the identifiers of Gantry objects. Every id is a UUIDv7, so ids sort
// by creation time (good index locality, and cursors can rely on it). Components take a
// Source by injection so tests can supply their own.
package ids

import "github.com/google/uuid"

// Source mints ids.
type Source interface {
	New() uuid.UUID
}

// V7 is the production source.
type V7 struct{}

// New returns a fresh UUIDv7. uuid.NewV7 only fails if the system's random source does,
// which leaves nothing sensible to do but stop.
func (V7) New() uuid.UUID { return uuid.Must(uuid.NewV7()) }
