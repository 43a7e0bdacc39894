package nodes

import (
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes/nodesdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes/probe"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// Config is the feature's configuration (app.Config fills it from the environment).
type Config struct {
	// EnrollmentTokenTTL is how long a one-time enrollment token stays usable.
	EnrollmentTokenTTL time.Duration
	// ProbePort is the TCP port probed when a node does not name one (the SSH port).
	ProbePort int
	// TelemetryMinInterval is the least time between two stored routine telemetry
	// samples of one node (health changes and XID errors are stored at once).
	TelemetryMinInterval time.Duration
}

// Defaults.
const (
	DefaultEnrollmentTokenTTL   = 15 * time.Minute
	DefaultProbePort            = 22
	DefaultTelemetryMinInterval = 30 * time.Second
	// MaxGPUsPerNode bounds an inventory report (the largest hosts carry 16).
	MaxGPUsPerNode = 64
)

// GPUAllocations tells node administration which GPUs live allocations hold. The
// allocations feature implements it; until then NoAllocations says none.
type GPUAllocations interface {
	// AllocatedGPUs returns, per node, the UUIDs of the GPUs held by live allocations.
	AllocatedGPUs(ctx context.Context) (map[uuid.UUID][]string, error)
	// NodeInUse reports whether live allocations hold anything on the node.
	NodeInUse(ctx context.Context, nodeID uuid.UUID) (bool, error)
}

// NoAllocations is GPUAllocations before allocations exist: nothing is allocated.
type NoAllocations struct{}

func (NoAllocations) AllocatedGPUs(context.Context) (map[uuid.UUID][]string, error) {
	return map[uuid.UUID][]string{}, nil
}
func (NoAllocations) NodeInUse(context.Context, uuid.UUID) (bool, error) { return false, nil }

// Service is node administration over PostgreSQL. The fabric-facing fields (Presence,
// Disconnector, Fabric) may be set after New, before the service is used: the fabric is
// built with this Service as its fleet.Directory.
type Service struct {
	Pool        *pgxpool.Pool
	Clock       clock.Clock
	IDs         ids.Source
	Rand        io.Reader
	Audit       *audit.Log
	Outbox      *outbox.Writer
	Prober      *probe.Prober
	Allocations GPUAllocations
	Config      Config
	Log         *slog.Logger

	Presence     fleet.PresenceReader
	Disconnector fleet.Disconnector
	Fabric       fleet.FabricInfo

	telemetry coalescer
}

var _ fleet.Directory = (*Service)(nil)

// New returns a Service with production defaults for what cfg leaves zero.
func New(pool *pgxpool.Pool, clk clock.Clock, idSrc ids.Source, prober *probe.Prober, cfg Config, log *slog.Logger) *Service {
	if cfg.EnrollmentTokenTTL <= 0 {
		cfg.EnrollmentTokenTTL = DefaultEnrollmentTokenTTL
	}
	if cfg.ProbePort <= 0 || cfg.ProbePort > 65535 {
		cfg.ProbePort = DefaultProbePort
	}
	if cfg.TelemetryMinInterval <= 0 {
		cfg.TelemetryMinInterval = DefaultTelemetryMinInterval
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if prober == nil {
		prober = probe.New(probe.Policy{}, probe.DefaultTimeout)
	}
	return &Service{
		Pool: pool, Clock: clk, IDs: idSrc, Rand: rand.Reader,
		Audit:  &audit.Log{Clock: clk, IDs: idSrc},
		Outbox: &outbox.Writer{Clock: clk, IDs: idSrc},
		Prober: prober, Allocations: NoAllocations{}, Config: cfg, Log: log,
	}
}

func (s *Service) read(ctx context.Context) *nodesdb.Queries {
	return nodesdb.New(db.Querier(ctx, s.Pool))
}

func (s *Service) event(ctx context.Context, tx pgx.Tx, typ string, nodeID uuid.UUID, extra map[string]any) error {
	payload := map[string]any{"node_id": nodeID.String()}
	for k, v := range extra {
		payload[k] = v
	}
	_, err := s.Outbox.Enqueue(ctx, tx, outbox.Event{Type: typ, Subject: "gantry.events." + typ, Payload: payload})
	return err
}

// disconnect ends the node's tunnel through the fabric (no-op without one).
func (s *Service) disconnect(ctx context.Context, nodeID uuid.UUID, reason string) error {
	if s.Disconnector == nil {
		return nil
	}
	err := s.Disconnector.Disconnect(context.WithoutCancel(ctx), nodeID, reason)
	if err != nil {
		s.Log.WarnContext(ctx, "node disconnect failed", "node_id", nodeID, "reason", reason, "err", err)
	}
	return err
}

func (s *Service) now() time.Time { return s.Clock.Now().UTC() }

func ptr[T any](v T) *T { return &v }
