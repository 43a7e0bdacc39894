package proxy

import (
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
)

// admissions remembers, for AccessCacheTTL, that a caller may use an instance and
// where it is served: a page that loads fifty assets, or an API client at a steady
// rate, then costs one project-access and one instance read per second instead of two
// database round trips per request. A refusal is never remembered, and neither is a
// machine identity's admission (its rights are its token's, checked every time). The
// price is that a member removed from the project, or an instance stopping, is noticed
// up to one TTL late; the agent refuses streams to a stopped app at once anyway.
type admissions struct {
	ttl time.Duration

	mu sync.Mutex
	m  map[admissionKey]admissionEntry
}

type admissionKey struct {
	user, tenant, instance uuid.UUID
	tenantRole             string
}

type admissionEntry struct {
	a   admitted
	exp time.Time
}

// maxAdmissions bounds the cache; past it, it starts over.
const maxAdmissions = 10000

func keyOf(p *principal.Principal, instance uuid.UUID) (admissionKey, bool) {
	if p == nil || p.Machine != nil {
		return admissionKey{}, false
	}
	return admissionKey{user: p.UserID, tenant: p.TenantID, tenantRole: p.TenantRole, instance: instance}, true
}

func (c *admissions) get(p *principal.Principal, instance uuid.UUID, now time.Time) (admitted, bool) {
	if c.ttl <= 0 {
		return admitted{}, false
	}
	k, ok := keyOf(p, instance)
	if !ok {
		return admitted{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok || !now.Before(e.exp) {
		return admitted{}, false
	}
	a := e.a
	a.p = p
	return a, true
}

func (c *admissions) put(a admitted, instance uuid.UUID, now time.Time) {
	if c.ttl <= 0 {
		return
	}
	k, ok := keyOf(a.p, instance)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxAdmissions {
		c.m = map[admissionKey]admissionEntry{}
	}
	c.m[k] = admissionEntry{a: a, exp: now.Add(c.ttl)}
}
