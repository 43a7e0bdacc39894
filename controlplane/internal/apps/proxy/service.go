package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/controlplane/internal/ratelimit"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
)

// Instance states in which the proxy carries traffic (the instances service's names,
// docs/apps.md). unhealthy is included: a failing health check does not mean the app
// answers nothing, and its user may need to look at it.
const (
	StateRunning   = "running"
	StateUnhealthy = "unhealthy"
)

// Target is where an app instance is served and who owns it, as the instances service
// knows it now.
type Target struct {
	InstanceID   uuid.UUID
	TenantID     uuid.UUID
	ProjectID    uuid.UUID
	AllocationID uuid.UUID
	NodeID       uuid.UUID
	// Port is the app's port on the node's loopback (1..65535).
	Port int
	// State is the instance's state (requested, starting, running, unhealthy,
	// stopping, stopped, failed).
	State string
	// KeepPrefix: the app serves under its proxy path (it was started with it as its
	// base URL, e.g. Jupyter's --NotebookApp.base_url), so requests reach it with the
	// whole path; otherwise the prefix /api/v1/app-proxy/{id} is removed and the app
	// sees "/..." (X-Forwarded-Prefix names what was removed).
	KeepPrefix bool
}

// Instances resolves an app instance for the proxy (implemented by the instances
// service). A missing instance is apierr.AppInstanceNotFound.
type Instances interface {
	ProxyTarget(ctx context.Context, instanceID uuid.UUID) (Target, error)
}

// Authenticator authenticates a bearer token (the server's: auth.Authenticator).
type Authenticator interface {
	Authenticate(r *http.Request) (*principal.Principal, error)
}

// Projects resolves the caller's role in a project (tenancy.Service); a project the
// caller may not act in is insufficient_permissions.
type Projects interface {
	Access(ctx context.Context, p *principal.Principal, projectID uuid.UUID) (projectctx.Project, error)
}

// Grants admits callers who are not members of the instance's project (a shared
// runtime's attached projects, a grant the owner made). It answers the project the
// call is made for (whose ledger a metered call is rated into), or ok false.
type Grants interface {
	ProxyGrant(ctx context.Context, p *principal.Principal, t Target) (projectID uuid.UUID, ok bool, err error)
}

// Meter is told of every call the proxy carried to an app that the app answered with
// a billable status (Billable: one HTTP request, or one WebSocket whose upgrade the app
// accepted), after the app's response head arrived and before it is passed on: shared
// runtimes meter attached projects' calls as app_runtime usage. A call the proxy
// answers itself (502/503/504: node offline, app unreachable, no answer in time) never
// reaches it. An error withholds the app's answer (the caller gets the error's
// envelope).
type Meter interface {
	ProxiedCall(ctx context.Context, c Call) error
}

// Billable reports whether an app's answer with status is metered: everything below
// 500. An app's own 5xx is its failure to serve the call, not a service rendered (an
// inference server that crashed mid-request answers 500), so it is not billed either.
func Billable(status int) bool { return status < 500 }

// Call is one proxied call, as Meter sees it.
type Call struct {
	Target    Target
	UserID    uuid.UUID
	ProjectID uuid.UUID // the caller's project: the instance's, or the one Grants named
	CallID    uuid.UUID // unique per call (idempotent metering)
	WebSocket bool
	At        time.Time
}

// Limiter counts the proxy's requests (implemented by *ratelimit.Limiter, the API's:
// Redis-backed, shared by the replicas, counting in memory while Redis is down).
type Limiter interface {
	Group(name string) (ratelimit.Group, bool)
	Check(ctx context.Context, g ratelimit.Group, client string) *apierr.Error
}

// Streams opens raw streams to node agents, relayed to the replica holding the node's
// tunnel (terminal.Service.OpenStream).
type Streams interface {
	OpenStream(octx, bctx context.Context, nodeID uuid.UUID, pre *fabricv1.StreamPreamble) (net.Conn, error)
}

// Deps are what the proxy runs on.
type Deps struct {
	Instances Instances
	Auth      Authenticator
	Projects  Projects
	Streams   Streams
	// JS holds the exchange codes (a KV bucket shared by every replica).
	JS jetstream.JetStream
	// CookieKey (at least 32 bytes) signs instance cookies; app derives it from the
	// master key so every replica holds the same one.
	CookieKey []byte
	Grants    Grants // nil: members only
	Meter     Meter  // nil: nothing metered
	// Limiter limits requests per principal (group ratelimit.AppProxyGroup); nil:
	// unlimited. The proxy sits in front of the API chain, so the API's limiter does not
	// see its requests.
	Limiter  Limiter
	Denials  audit.Observer
	Registry prometheus.Registerer
	Clock    clock.Clock
	Log      *slog.Logger
}

// Service is the app proxy of one replica.
type Service struct {
	cfg       Config
	deps      Deps
	metrics   *metrics
	transport *http.Transport
	rp        *httputil.ReverseProxy
	codes     *codeStore
	admitted  *admissions
	// limitGroup is the Limiter's app_proxy group (PerMinute 0: unlimited).
	limitGroup ratelimit.Group

	// life is the context of the streams kept alive between requests (pooled
	// connections, relayed hops); Close ends it.
	life   context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	upgrade map[*upgraded]struct{} // WebSockets this replica carries now
}

// New assembles the proxy.
func New(cfg Config, deps Deps) (*Service, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if deps.Instances == nil || deps.Auth == nil || deps.Projects == nil || deps.Streams == nil || deps.JS == nil {
		return nil, errors.New("app proxy: Instances, Auth, Projects, Streams and JS are required")
	}
	if len(deps.CookieKey) < 32 {
		return nil, errors.New("app proxy: CookieKey must be at least 32 bytes")
	}
	if deps.Clock == nil {
		deps.Clock = clock.Real{}
	}
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(deps.Registry)
	if err != nil {
		return nil, fmt.Errorf("app proxy metrics: %w", err)
	}
	life, cancel := context.WithCancel(context.Background())
	s := &Service{cfg: cfg, deps: deps, metrics: m, life: life, cancel: cancel,
		codes:    &codeStore{js: deps.JS, bucket: cfg.CodeBucket, ttl: cfg.ExchangeTTL},
		admitted: &admissions{ttl: cfg.AccessCacheTTL},
		upgrade:  map[*upgraded]struct{}{}}
	if deps.Limiter != nil {
		s.limitGroup, _ = deps.Limiter.Group(ratelimit.AppProxyGroup)
	}
	s.transport = s.newTransport()
	s.rp = s.reverseProxy()
	return s, nil
}

// Close ends every connection the proxy holds: pooled streams and open WebSockets.
func (s *Service) Close() {
	s.cancel()
	s.transport.CloseIdleConnections()
	s.mu.Lock()
	ups := make([]*upgraded, 0, len(s.upgrade))
	for u := range s.upgrade {
		ups = append(ups, u)
	}
	s.mu.Unlock()
	for _, u := range ups {
		u.close()
	}
}

func (s *Service) now() time.Time { return s.deps.Clock.Now().UTC() }
