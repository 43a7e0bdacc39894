// Package ids mints the identifiers of Gantry objects. Every id is a UUIDv7, so ids sort
// by creation time (good index locality, and cursors can rely on it); tests inject a
// Sequence to get predictable ids.
package ids

import (
	"sync"

	"github.com/google/uuid"
)

// Source mints ids.
type Source interface {
	New() uuid.UUID
}

// V7 is the production source.
type V7 struct{}

// New returns a fresh UUIDv7. uuid.NewV7 only fails if the system's random source does,
// which leaves nothing sensible to do but stop.
func (V7) New() uuid.UUID { return uuid.Must(uuid.NewV7()) }

// Sequence returns ids in a fixed order for tests: base with its last 8 bytes counting up.
type Sequence struct {
	mu   sync.Mutex
	base uuid.UUID
	n    uint64
}

// NewSequence starts a sequence at base.
func NewSequence(base uuid.UUID) *Sequence { return &Sequence{base: base} }

func (s *Sequence) New() uuid.UUID {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	id := s.base
	for i := 0; i < 8; i++ {
		id[15-i] = byte(s.n >> (8 * i))
	}
	return id
}
