package auth

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
)

// Verification results are memoised briefly: an RS256 check costs about 24 µs here,
// which is most of the chain's cost on a cheap authenticated read. A result is kept for
// at most verifiedTTL and never past the token's own exp, so expiry is exact and a key
// that leaves the published set stops being honoured within verifiedTTL.
const (
	verifiedTTL     = 30 * time.Second
	verifiedMaxSize = 10000
)

type verifiedEntry struct {
	p     *principal.Principal
	until time.Time
}

type verifiedCache struct {
	mu      sync.Mutex
	entries map[string]verifiedEntry
}

func (c *verifiedCache) get(token string, now time.Time) (*principal.Principal, bool) {
	c.mu.Lock()
	e, ok := c.entries[token]
	c.mu.Unlock()
	if !ok || !now.Before(e.until) {
		return nil, false
	}
	return clonePrincipal(e.p), true
}

func (c *verifiedCache) put(token string, p *principal.Principal, now, exp time.Time) {
	until := now.Add(verifiedTTL)
	if exp.Before(until) {
		until = exp
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil || len(c.entries) >= verifiedMaxSize {
		// Dropping everything bounds memory without bookkeeping; the next requests
		// simply verify again.
		c.entries = make(map[string]verifiedEntry, 256)
	}
	c.entries[token] = verifiedEntry{p: clonePrincipal(p), until: until}
}

// clonePrincipal hands every request its own copy, so no handler can change another's.
func clonePrincipal(p *principal.Principal) *principal.Principal {
	cp := *p
	cp.PlatformRole = slices.Clone(p.PlatformRole)
	cp.Capabilities = slices.Clone(p.Capabilities)
	cp.AMR = slices.Clone(p.AMR)
	if p.Machine != nil { // read-only after verification; copied so no caller can widen the cached one
		m := *p.Machine
		m.Projects = maps.Clone(p.Machine.Projects)
		cp.Machine = &m
	}
	return &cp
}
