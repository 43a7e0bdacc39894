package gateway

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/shared/clock"
)

// ErrUnauthenticated is what an Introspector returns for a token that is malformed,
// unknown, revoked or rotated away. Any other error means "could not tell" (the control
// plane is unreachable) and is never cached.
var ErrUnauthenticated = errors.New("gateway: node token not accepted")

// Introspector says which node a bearer token belongs to.
type Introspector interface {
	Introspect(ctx context.Context, token string) (nodeID uuid.UUID, err error)
}

// IntrospectorFunc adapts a function (tests, the bench).
type IntrospectorFunc func(ctx context.Context, token string) (uuid.UUID, error)

func (f IntrospectorFunc) Introspect(ctx context.Context, token string) (uuid.UUID, error) {
	return f(ctx, token)
}

// authCache remembers introspection answers: accepted tokens for ttl, refused ones for
// negTTL, at most size entries. Concurrent misses of one token share one introspection,
// so a fleet reconnecting after a blink does not stampede the control plane.
type authCache struct {
	next   Introspector
	clock  clock.Clock
	ttl    time.Duration
	negTTL time.Duration
	size   int

	mu       sync.Mutex
	entries  map[[32]byte]authEntry
	inflight map[[32]byte]*authCall
}

type authEntry struct {
	node    uuid.UUID
	ok      bool
	expires time.Time
}

type authCall struct {
	done chan struct{}
	node uuid.UUID
	err  error
}

func newAuthCache(next Introspector, c clock.Clock, ttl, negTTL time.Duration, size int) *authCache {
	return &authCache{
		next: next, clock: c, ttl: ttl, negTTL: negTTL, size: size,
		entries:  make(map[[32]byte]authEntry),
		inflight: make(map[[32]byte]*authCall),
	}
}

// Introspect answers from the cache when it can. Keys are SHA-256 digests, so the cache
// never holds a bearer token.
func (c *authCache) Introspect(ctx context.Context, token string) (uuid.UUID, error) {
	key := sha256.Sum256([]byte(token))
	now := c.clock.Now()
	c.mu.Lock()
	if e, ok := c.entries[key]; ok {
		if now.Before(e.expires) {
			c.mu.Unlock()
			if !e.ok {
				return uuid.Nil, ErrUnauthenticated
			}
			return e.node, nil
		}
		delete(c.entries, key)
	}
	if call, ok := c.inflight[key]; ok {
		c.mu.Unlock()
		select {
		case <-call.done:
			return call.node, call.err
		case <-ctx.Done():
			return uuid.Nil, ctx.Err()
		}
	}
	call := &authCall{done: make(chan struct{})}
	c.inflight[key] = call
	c.mu.Unlock()

	// The shared call must not die with the first caller's request.
	node, err := c.next.Introspect(context.WithoutCancel(ctx), token)
	call.node, call.err = node, err

	c.mu.Lock()
	delete(c.inflight, key)
	switch {
	case err == nil && c.ttl > 0:
		c.put(key, authEntry{node: node, ok: true, expires: c.clock.Now().Add(c.ttl)})
	case errors.Is(err, ErrUnauthenticated) && c.negTTL > 0:
		c.put(key, authEntry{expires: c.clock.Now().Add(c.negTTL)})
	}
	c.mu.Unlock()
	close(call.done)
	return node, err
}

// put stores e, first making room: expired entries go, then arbitrary ones (map order).
// Caller holds mu.
func (c *authCache) put(key [32]byte, e authEntry) {
	if len(c.entries) >= c.size {
		now := c.clock.Now()
		for k, v := range c.entries {
			if !now.Before(v.expires) {
				delete(c.entries, k)
			}
		}
		for k := range c.entries {
			if len(c.entries) < c.size {
				break
			}
			delete(c.entries, k)
		}
	}
	c.entries[key] = e
}

// len is the number of cached entries (tests).
func (c *authCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
