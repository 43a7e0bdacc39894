package readmodels

import (
	"context"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// Cache keeps computed shell contexts per user, one field per project (or "-" for
// none), so that a change of the user's own attention (a dismissal, the read marker)
// forgets all of that user's entries at once. Entries outlive their freshness (kept for
// StaleFor) so that a failed refresh can still be answered, marked stale.
type Cache interface {
	Get(ctx context.Context, user uuid.UUID, field string) ([]byte, bool, error)
	Put(ctx context.Context, user uuid.UUID, field string, value []byte, keep time.Duration) error
	Forget(ctx context.Context, user uuid.UUID) error
}

// MemoryCache is a process-local Cache (no Redis configured, and tests).
type MemoryCache struct {
	mu    sync.Mutex
	users map[uuid.UUID]map[string]memEntry
	// Now is the clock of expiry (time.Now when nil).
	Now func() time.Time
}

type memEntry struct {
	value   []byte
	expires time.Time
}

func (m *MemoryCache) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// Get implements Cache.
func (m *MemoryCache) Get(_ context.Context, user uuid.UUID, field string) ([]byte, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.users[user][field]
	if !ok || !m.now().Before(e.expires) {
		return nil, false, nil
	}
	return e.value, true, nil
}

// Put implements Cache.
func (m *MemoryCache) Put(_ context.Context, user uuid.UUID, field string, value []byte, keep time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.users == nil {
		m.users = map[uuid.UUID]map[string]memEntry{}
	}
	if m.users[user] == nil {
		m.users[user] = map[string]memEntry{}
	}
	m.users[user][field] = memEntry{value: value, expires: m.now().Add(keep)}
	return nil
}

// Forget implements Cache.
func (m *MemoryCache) Forget(_ context.Context, user uuid.UUID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.users, user)
	return nil
}

// RedisCache is a Cache shared by every replica: one hash per user, so that a
// dismissal on one replica is seen by all.
type RedisCache struct {
	Client *redis.Client
	Prefix string
}

func (r RedisCache) key(user uuid.UUID) string { return r.Prefix + "v3shell:" + user.String() }

// Get implements Cache.
func (r RedisCache) Get(ctx context.Context, user uuid.UUID, field string) ([]byte, bool, error) {
	b, err := r.Client.HGet(ctx, r.key(user), field).Bytes()
	if err == redis.Nil {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return b, true, nil
}

// Put implements Cache. The hash expires keep after its latest write: a user's entries
// go together.
func (r RedisCache) Put(ctx context.Context, user uuid.UUID, field string, value []byte, keep time.Duration) error {
	k := r.key(user)
	_, err := r.Client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, k, field, value)
		p.Expire(ctx, k, keep)
		return nil
	})
	return err
}

// Forget implements Cache.
func (r RedisCache) Forget(ctx context.Context, user uuid.UUID) error {
	return r.Client.Del(ctx, r.key(user)).Err()
}
