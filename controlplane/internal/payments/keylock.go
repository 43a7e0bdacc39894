package payments

import "sync"

// keyLock serialises work on one key inside this process. Webhook deliveries and
// refunds of one payment wait here, holding no database connection, instead of each
// holding a pooled connection while blocked on the payment's row lock: enough blocked
// holders would leave the lock owner no connection for a nested query (a first ledger
// posting creates its accounts on a connection of its own). Row locks still decide
// between replicas.
type keyLock struct {
	mu   sync.Mutex
	keys map[string]*keyEntry
}

type keyEntry struct {
	mu   sync.Mutex
	refs int
}

// lock takes key's lock and returns its release.
func (l *keyLock) lock(key string) (unlock func()) {
	l.mu.Lock()
	if l.keys == nil {
		l.keys = map[string]*keyEntry{}
	}
	e := l.keys[key]
	if e == nil {
		e = &keyEntry{}
		l.keys[key] = e
	}
	e.refs++
	l.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		l.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(l.keys, key)
		}
		l.mu.Unlock()
	}
}
