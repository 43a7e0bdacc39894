package fabric

import (
	"math/rand/v2"
	"testing"

	"github.com/google/uuid"
)

// The mirror's running online count must equal a count of its entries after any mix of
// newer, stale and removing updates.
func TestPresenceMirrorOnlineCountFollowsEntries(t *testing.T) {
	m := newPresenceMirror()
	ids := make([]uuid.UUID, 20)
	for i := range ids {
		ids[i] = uuid.New()
	}
	rng := rand.New(rand.NewPCG(1, 2))
	revs := map[uuid.UUID]uint64{}
	for step := 0; step < 5000; step++ {
		id := ids[rng.IntN(len(ids))]
		// Sometimes a stale revision, which must change nothing.
		rev := revs[id] + 1
		if rng.IntN(5) == 0 && revs[id] > 1 {
			rev = revs[id] - 1
		}
		if rng.IntN(4) == 0 {
			m.remove(id, rev)
		} else {
			m.apply(presenceEntry{NodeID: id, Online: rng.IntN(2) == 0}, rev)
		}
		if rev > revs[id] {
			revs[id] = rev
		}
		want := 0
		for _, e := range m.all() {
			if e.Online {
				want++
			}
		}
		if got := m.onlineCount(); got != want {
			t.Fatalf("step %d: onlineCount %d, entries say %d", step, got, want)
		}
	}
}
