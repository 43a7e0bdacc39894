package terminal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/terminal/terminaldb"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// Fabric opens raw streams to node agents (implemented by *fabric.Server): only on the
// replica holding the node's tunnel; elsewhere a *fabric.NotHeldHereError names it.
type Fabric interface {
	OpenStream(ctx context.Context, nodeID uuid.UUID, pre *fabricv1.StreamPreamble) (net.Conn, error)
	ReplicaID() string
}

// Deps are what the service runs on.
type Deps struct {
	Pool        *pgxpool.Pool
	Clock       clock.Clock
	IDs         ids.Source
	Log         *slog.Logger
	Allocations Allocations
	Fabric      Fabric
	NATS        *nats.Conn
	JS          jetstream.JetStream
	// Registry receives the terminal metrics (the app's registry).
	Registry prometheus.Registerer
	// RelayKey (at least 32 bytes) signs relay tokens between replicas; app derives it
	// from the master key, so every replica holds the same one.
	RelayKey []byte
	// EventsSubjectPrefix is where allocation status events arrive ("gantry.events.").
	EventsSubjectPrefix string
	// RelayClient dials other replicas (default: a plain client).
	RelayClient *http.Client
	// Denials audits the WebSocket operations' refusals (401, 403), which are answered
	// here rather than by the server's error mapper (denials.go); nil audits none.
	Denials DenialRecorder
}

// Service is the terminal feature of one replica.
type Service struct {
	cfg     Config
	deps    Deps
	audit   *audit.Log
	metrics *metrics
	relays  *relayDirectory
	nonces  nonceCache

	mu      sync.Mutex
	bridges map[uuid.UUID]map[*bridge]struct{} // live bridges on this replica, by allocation
	pipes   map[*relayPipe]struct{}            // relayed streams this replica serves
	closing bool
	wg      sync.WaitGroup
}

// New assembles the service. ctx is unused today (the replica bucket opens on first
// use) and kept for assemblies that will need it.
func New(ctx context.Context, cfg Config, deps Deps) (*Service, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if deps.Pool == nil || deps.Allocations == nil || deps.Fabric == nil || deps.JS == nil || deps.NATS == nil {
		return nil, errors.New("terminal: Pool, Allocations, Fabric, NATS and JS are required")
	}
	if len(deps.RelayKey) < 32 {
		return nil, errors.New("terminal: RelayKey must be at least 32 bytes")
	}
	if deps.Clock == nil {
		deps.Clock = clock.Real{}
	}
	if deps.IDs == nil {
		deps.IDs = ids.V7{}
	}
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	if deps.RelayClient == nil {
		deps.RelayClient = &http.Client{}
	}
	m, err := newMetrics(deps.Registry)
	if err != nil {
		return nil, fmt.Errorf("terminal metrics: %w", err)
	}
	return &Service{
		cfg: cfg, deps: deps, metrics: m, relays: newRelayDirectory(deps.JS, cfg.ReplicaBucket, deps.Fabric.ReplicaID()),
		audit:   &audit.Log{Clock: deps.Clock, IDs: deps.IDs},
		bridges: map[uuid.UUID]map[*bridge]struct{}{},
		pipes:   map[*relayPipe]struct{}{},
	}, nil
}

// Handlers returns the strict-server handlers of the feature.
func (s *Service) Handlers() *Handlers { return &Handlers{Svc: s} }

func (s *Service) q(ctx context.Context) *terminaldb.Queries {
	return terminaldb.New(db.Querier(ctx, s.deps.Pool))
}

func (s *Service) now() time.Time { return s.deps.Clock.Now().UTC() }

// Run keeps this replica's relay address published (advertiseURL, unless
// GANTRY_TERMINAL_INTERNAL_URL overrides it), closes the terminals of allocations that
// stop running as their status events arrive, and ends sessions left detached past the
// grace. When ctx ends it detaches every terminal this replica bridges (their sessions
// survive on the node for a reattach through another replica) and returns.
func (s *Service) Run(ctx context.Context, advertiseURL string) error {
	base := s.cfg.InternalURL
	if base == "" {
		base = reachable(advertiseURL)
	}
	sub, err := s.subscribeAllocationEvents()
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := s.relays.publish(ctx, base); err != nil {
		s.deps.Log.WarnContext(ctx, "terminal: publishing the relay address failed", "err", err)
	}
	refresh := time.NewTicker(relayRefresh)
	defer refresh.Stop()
	sweep := time.NewTicker(time.Minute)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			s.shutdown()
			return nil
		case <-refresh.C:
			if err := s.relays.publish(ctx, base); err != nil && ctx.Err() == nil {
				s.deps.Log.WarnContext(ctx, "terminal: refreshing the relay address failed", "err", err)
			}
		case <-sweep.C:
			if _, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
				s.deps.Log.WarnContext(ctx, "terminal: session sweep failed", "err", err)
			}
		}
	}
}

// shutdown detaches every bridge and relayed stream of this replica and waits for them.
func (s *Service) shutdown() {
	s.mu.Lock()
	s.closing = true
	var all []*bridge
	for _, set := range s.bridges {
		for b := range set {
			all = append(all, b)
		}
	}
	pipes := make([]*relayPipe, 0, len(s.pipes))
	for p := range s.pipes {
		pipes = append(pipes, p)
	}
	s.mu.Unlock()
	for _, b := range all {
		b.stop(cause{kind: causeShutdown})
	}
	for _, p := range pipes {
		p.close()
	}
	s.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s.relays.withdraw(ctx)
}

// track registers a live bridge; false when the replica is shutting down.
func (s *Service) track(b *bridge) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	set := s.bridges[b.alloc.ID]
	if set == nil {
		set = map[*bridge]struct{}{}
		s.bridges[b.alloc.ID] = set
	}
	set[b] = struct{}{}
	s.wg.Add(1)
	s.metrics.attached.Inc()
	return true
}

func (s *Service) untrack(b *bridge) {
	s.mu.Lock()
	if set := s.bridges[b.alloc.ID]; set != nil {
		if _, ok := set[b]; ok {
			delete(set, b)
			s.wg.Done()
			s.metrics.attached.Dec()
		}
		if len(set) == 0 {
			delete(s.bridges, b.alloc.ID)
		}
	}
	s.mu.Unlock()
}

// localBridges are the bridges of an allocation on this replica.
func (s *Service) localBridges(allocationID uuid.UUID) []*bridge {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*bridge, 0, len(s.bridges[allocationID]))
	for b := range s.bridges[allocationID] {
		out = append(out, b)
	}
	return out
}

// ActiveBridges is how many terminal WebSockets this replica bridges now.
func (s *Service) ActiveBridges() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, set := range s.bridges {
		n += len(set)
	}
	return n
}

// reachable replaces an unspecified listen host (0.0.0.0, ::) in a base URL with this
// machine's host name, which other replicas can at least try; set
// GANTRY_TERMINAL_INTERNAL_URL where that is not enough.
func reachable(base string) string {
	u, err := url.Parse(base)
	if err != nil {
		return base
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return base
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		if h, err := os.Hostname(); err == nil && h != "" {
			u.Host = net.JoinHostPort(h, port)
		}
	}
	return u.String()
}
