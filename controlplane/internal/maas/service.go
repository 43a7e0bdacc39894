package maas

import (
	"context"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/catalog"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// Config is the feature's configuration (app.Config fills it from the environment).
type Config struct {
	// ControlPlaneURL is the URL deployed machines reach the control plane at (the
	// node agent package, enrollment).
	ControlPlaneURL string
	// ServerCAPEM pins the control plane's HTTPS CA on deployed machines (empty: system roots).
	ServerCAPEM string
	// LogGatewayURL is where node agents ship logs (optional).
	LogGatewayURL string
	// SyncInterval is the scheduled sync of every site (default 5m).
	SyncInterval time.Duration
	// StepTimeouts bound each workflow step; a step missing here uses DefaultStepTimeout.
	StepTimeouts map[string]time.Duration
	// PollInterval is how often waiting steps look again (default 5s).
	PollInterval time.Duration
	// CallTimeout bounds one MAAS API call.
	CallTimeout time.Duration
	// StepAttemptTimeout bounds one run of a step's job (default 3 min: a few MAAS calls).
	// River does not rescue a job from a killed replica before this has passed, so the
	// jobs' RescueStuckJobsAfter must exceed it (docs/jobs.md).
	StepAttemptTimeout time.Duration
}

// Defaults.
const (
	DefaultSyncInterval = 5 * time.Minute
	DefaultPollInterval = 5 * time.Second
	DefaultStepTimeout  = 10 * time.Minute
	// DefaultStepAttemptTimeout bounds one run of a step (Config.StepAttemptTimeout).
	DefaultStepAttemptTimeout = 3 * time.Minute
)

// DefaultStepTimeouts follow MAAS's own node_timeout (30 minutes for commissioning and
// deploying) and leave the agent time to install and enroll.
var DefaultStepTimeouts = map[string]time.Duration{
	StepAllocate:     2 * time.Minute,
	StepCommission:   30 * time.Minute,
	StepCreateNode:   2 * time.Minute,
	StepDeploy:       5 * time.Minute,
	StepWaitDeployed: 30 * time.Minute,
	StepWaitEnrolled: 15 * time.Minute,
	StepUncordon:     2 * time.Minute,
	StepCordon:       2 * time.Minute,
	StepDrain:        7 * 24 * time.Hour, // bounded by the operator's drain deadline
	StepRevokeToken:  2 * time.Minute,
	StepRelease:      30 * time.Minute,
	StepRetire:       2 * time.Minute,
}

// JobInserter inserts River jobs in the caller's transaction (the app's jobs runner or,
// in tests, a river.Client).
type JobInserter interface {
	InsertTx(ctx context.Context, tx pgx.Tx, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error)
}

// Allocations is what decommissioning needs of the allocations feature.
type Allocations interface {
	NodeInUse(ctx context.Context, nodeID uuid.UUID) (bool, error)
	// ForceReleaseNode force-releases every live allocation on the node and says how many.
	ForceReleaseNode(ctx context.Context, nodeID uuid.UUID) (int, error)
	// LiveOnNode counts the allocations on the node that have not ended.
	LiveOnNode(ctx context.Context, nodeID uuid.UUID) (int, error)
	// NodeWiped frees the GPUs that ended allocations still hold on the node, waiting for
	// a cleanup the node will never confirm: its machine was released with disk erase.
	NodeWiped(ctx context.Context, nodeID uuid.UUID) error
}

// NodeInventory is what onboarding needs to see of an enrolled node.
type NodeInventory interface {
	Get(ctx context.Context, id uuid.UUID) (nodes.Node, error)
}

// Service is the MAAS lifecycle over PostgreSQL.
type Service struct {
	Pool        *pgxpool.Pool
	Clock       clock.Clock
	IDs         ids.Source
	Audit       *audit.Log
	Outbox      *outbox.Writer
	Nodes       *nodes.Service
	Catalog     *catalog.Service
	Allocations Allocations
	Jobs        JobInserter
	Dialer      Dialer
	Config      Config
	Metrics     *Metrics
	Log         *slog.Logger

	// BeforeCommit, when set (tests only), runs inside each step's closing transaction
	// after the step's MAAS calls and writes: an error rolls it back as a crash there
	// would (crash_test.go); blocking parks the step at its most fragile point so a test
	// can SIGKILL the process there (sigkill_test.go).
	BeforeCommit func(ctx context.Context, workflow string, id uuid.UUID, step string) error

	seal sealer
}

// New returns a Service; sealKey (32 bytes, derived from the master key) seals API keys
// and enrollment tokens.
func New(pool *pgxpool.Pool, clk clock.Clock, idSrc ids.Source, nodeSvc *nodes.Service, cat *catalog.Service,
	sealKey []byte, cfg Config, log *slog.Logger) *Service {
	if cfg.SyncInterval <= 0 {
		cfg.SyncInterval = DefaultSyncInterval
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.StepAttemptTimeout <= 0 {
		cfg.StepAttemptTimeout = DefaultStepAttemptTimeout
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{
		Pool: pool, Clock: clk, IDs: idSrc,
		Audit:  &audit.Log{Clock: clk, IDs: idSrc},
		Outbox: &outbox.Writer{Clock: clk, IDs: idSrc},
		Nodes:  nodeSvc, Catalog: cat, Dialer: Dialer{CallTimeout: cfg.CallTimeout},
		Config: cfg, Metrics: NewMetrics(), Log: log, seal: sealer{key: sealKey},
	}
}

func (s *Service) now() time.Time { return s.Clock.Now().UTC() }

func (s *Service) stepTimeout(step string) time.Duration {
	if d, ok := s.Config.StepTimeouts[step]; ok && d > 0 {
		return d
	}
	if d, ok := DefaultStepTimeouts[step]; ok {
		return d
	}
	return DefaultStepTimeout
}

// event publishes a domain event in tx.
func (s *Service) event(ctx context.Context, tx pgx.Tx, typ string, payload map[string]any) error {
	_, err := s.Outbox.Enqueue(ctx, tx, outbox.Event{Type: typ, Subject: "gantry.events." + typ, Payload: payload})
	return err
}

// changed audits and publishes one state change in tx.
func (s *Service) changed(ctx context.Context, tx pgx.Tx, action, targetType, targetID, event string, meta map[string]any) error {
	if err := s.Audit.Record(ctx, tx, audit.Entry{Action: action, TargetType: targetType, TargetID: targetID, Metadata: meta}); err != nil {
		return err
	}
	if event == "" {
		return nil
	}
	payload := map[string]any{targetType + "_id": targetID}
	for k, v := range meta {
		payload[k] = v
	}
	return s.event(ctx, tx, event, payload)
}
