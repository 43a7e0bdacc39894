package app

import (
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/proxy"
	"github.com/gantry-gpu/gantry/controlplane/internal/auth"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/jobs"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodemetrics"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes/probe"
	"github.com/gantry-gpu/gantry/controlplane/internal/observability"
	"github.com/gantry-gpu/gantry/controlplane/internal/payments"
	"github.com/gantry-gpu/gantry/controlplane/internal/provisioning"
	"github.com/gantry-gpu/gantry/controlplane/internal/ratelimit"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/blob"
	"github.com/gantry-gpu/gantry/controlplane/internal/terminal"
)

// Config is the control plane's configuration, read from the environment. Every field
// has a default that works for `make dev`; README lists them.
type Config struct {
	HTTPAddr string `env:"GANTRY_HTTP_ADDR" envDefault:"127.0.0.1:8080"`
	// DatabaseURL logs in as the application's database role, which owns nothing and
	// cannot bypass the append-only tables' triggers (docs/development.md, "Database
	// roles"); serve refuses another unless AllowPrivilegedDatabaseRole.
	DatabaseURL string `env:"DATABASE_URL"`
	// MigrateDatabaseURL is the schema owner's, for migrate (DATABASE_URL when empty).
	MigrateDatabaseURL string `env:"GANTRY_MIGRATE_DATABASE_URL"`
	// AppDatabaseRole is the role migrate creates (when missing) and grants to.
	AppDatabaseRole string `env:"GANTRY_APP_DATABASE_ROLE" envDefault:"gantry_app"`
	// AllowPrivilegedDatabaseRole lets serve run as a role that could bypass the
	// append-only guarantee (the owner, a superuser): an escape hatch, not a setup.
	AllowPrivilegedDatabaseRole bool   `env:"GANTRY_ALLOW_PRIVILEGED_DATABASE_ROLE"`
	NATSURL                     string `env:"NATS_URL"`
	// RedisURL, when set, makes rate-limit counters shared across replicas.
	RedisURL string `env:"REDIS_URL"`
	LogLevel string `env:"GANTRY_LOG_LEVEL" envDefault:"info"`
	// MaxBodyBytes caps every request body.
	MaxBodyBytes int64 `env:"GANTRY_MAX_BODY_BYTES" envDefault:"1048576"`
	// RateLimits overrides per-group limits, e.g. "auth=60,admin=600,api=1200,internal=60".
	RateLimits string `env:"GANTRY_RATE_LIMITS"`
	// IdempotencyRetention is how long Idempotency-Key results are kept (at least 24h).
	IdempotencyRetention time.Duration `env:"GANTRY_IDEMPOTENCY_RETENTION" envDefault:"24h"`
	// CursorKey signs pagination cursors; derived from the master key when empty.
	CursorKey string `env:"GANTRY_CURSOR_KEY"`
	// EventsStream and EventsSubjectPrefix name where the outbox relay publishes.
	EventsStream        string `env:"GANTRY_EVENTS_STREAM" envDefault:"GANTRY_EVENTS"`
	EventsSubjectPrefix string `env:"GANTRY_EVENTS_SUBJECT_PREFIX" envDefault:"gantry.events."`
	// GCPercent is the Go garbage collector's target (runtime/debug.SetGCPercent) for
	// the serving process, unless GOGC is set; 0 leaves Go's default (100). See
	// ApplyGCPercent.
	GCPercent int `env:"GANTRY_GC_PERCENT" envDefault:"200"`
	// ShutdownTimeout bounds the graceful drain on SIGTERM / Ctrl-C.
	ShutdownTimeout time.Duration `env:"GANTRY_SHUTDOWN_TIMEOUT" envDefault:"15s"`
	// RequestTimeout is every request's deadline (WebSocket sessions excepted): a
	// database that does not answer in it gives 503 service_unavailable (docs/api.md).
	RequestTimeout time.Duration `env:"GANTRY_REQUEST_TIMEOUT" envDefault:"10s"`
	// DatabaseConnectTimeout bounds one new PostgreSQL connection (a connect_timeout
	// in DATABASE_URL wins).
	DatabaseConnectTimeout time.Duration `env:"GANTRY_DATABASE_CONNECT_TIMEOUT" envDefault:"5s"`

	Auth auth.Config
	// Billing is GANTRY_BILLING_*.
	Billing BillingConfig
	// Budgets is GANTRY_BUDGETS_*.
	Budgets BudgetsConfig
	// Payments is GANTRY_PAYMENTS_*.
	Payments PaymentsConfig
	// Nodes is NODE_PROBE_ALLOWED_CIDRS and GANTRY_NODE_* (docs/nodes.md).
	Nodes NodesConfig
	// Fabric is GANTRY_FABRIC_* and GANTRY_REPLICA_ID (docs/fabric.md).
	Fabric FabricConfig
	// Allocations is GANTRY_ALLOCATIONS_* and GANTRY_PROVISIONING_* (docs/allocations.md).
	Allocations AllocationsConfig
	// Terminal is GANTRY_TERMINAL_* (docs/terminal.md).
	Terminal terminal.Config
	// Provisioning is the provisioning dispatcher's GANTRY_PROVISIONING_* (docs/provisioning.md).
	Provisioning ProvisioningConfig
	// Storage is GANTRY_STORAGE_* quota and sweeper settings (docs/storage.md).
	Storage storage.Config
	// Jobs tunes the River client that runs background jobs (docs/jobs.md):
	// GANTRY_JOBS_MAX_WORKERS and GANTRY_JOBS_RESCUE_STUCK_AFTER; zero values are its defaults.
	Jobs jobs.Config
	// Blob is GANTRY_STORAGE_DRIVER, GANTRY_STORAGE_FS_ROOT and GANTRY_STORAGE_S3_* (the
	// object bytes' backend, docs/storage.md).
	Blob blob.Config
	// Observability is GANTRY_PROMETHEUS_URL, GANTRY_ALERTMANAGER_URL and the read models'
	// settings (docs/operations.md).
	Observability observability.Config
	// NodeMetrics is GANTRY_NODE_METRICS_*: node agents' metrics served to Prometheus
	// through the fabric (docs/nodeagent.md, "Metrics").
	NodeMetrics nodemetrics.Config
	// AppProxy is GANTRY_APP_PROXY_* (docs/app-proxy.md).
	AppProxy proxy.Config
	// AppInstances is GANTRY_APP_INSTANCES_* and GANTRY_SHARED_RUNTIMES_INTERVAL (docs/apps.md).
	AppInstances AppInstancesConfig
	// Maas is GANTRY_MAAS_*: the bare-metal lifecycle through MAAS (docs/maas.md).
	Maas MaasConfig
}

// ProvisioningConfig configures the provisioning stream and dispatcher
// (docs/provisioning.md); GANTRY_PROVISIONING_TIMEOUT is in AllocationsConfig. Stream and
// SubjectPrefix left empty in a Config built by hand (tests, benchmarks) are named after
// the events stream, so they cannot collide.
type ProvisioningConfig struct {
	// Stream is the JetStream work-queue stream of dispatch messages.
	Stream string `env:"GANTRY_PROVISIONING_STREAM" envDefault:"PROVISIONING"`
	// SubjectPrefix is the stream's subject prefix.
	SubjectPrefix string `env:"GANTRY_PROVISIONING_SUBJECT_PREFIX" envDefault:"gantry.provisioning."`
	// Consumer is the durable consumer every replica shares.
	Consumer string `env:"GANTRY_PROVISIONING_CONSUMER" envDefault:"provisioning-dispatcher"`
	// AckWait: a delivered message unacknowledged this long goes to another replica.
	AckWait time.Duration `env:"GANTRY_PROVISIONING_ACK_WAIT" envDefault:"1m"`
	// MaxAckPending bounds the messages delivered and not yet acknowledged (all replicas).
	MaxAckPending int `env:"GANTRY_PROVISIONING_MAX_ACK_PENDING" envDefault:"10000"`
	// Workers bounds one replica's deliveries in flight.
	Workers int `env:"GANTRY_PROVISIONING_WORKERS" envDefault:"64"`
	// AttemptTimeout bounds one delivery (waiting for the agent's ack).
	AttemptTimeout time.Duration `env:"GANTRY_PROVISIONING_ATTEMPT_TIMEOUT" envDefault:"15s"`
	// BackoffMin and BackoffMax bound the retry delay of an undelivered task.
	BackoffMin time.Duration `env:"GANTRY_PROVISIONING_BACKOFF_MIN" envDefault:"1s"`
	BackoffMax time.Duration `env:"GANTRY_PROVISIONING_BACKOFF_MAX" envDefault:"30s"`
	// DepthInterval is how often the queue metrics are refreshed.
	DepthInterval time.Duration `env:"GANTRY_PROVISIONING_DEPTH_INTERVAL" envDefault:"15s"`
}

// provisioning is the dispatcher's configuration.
func (c Config) provisioning() provisioning.Config {
	p := c.Provisioning
	if p.Stream == "" {
		p.Stream = c.EventsStream + "_PROVISIONING"
	}
	if p.SubjectPrefix == "" {
		p.SubjectPrefix = c.siblingSubjectPrefix("provisioning")
	}
	return provisioning.Config{
		Stream: p.Stream, SubjectPrefix: p.SubjectPrefix, Consumer: p.Consumer, AckWait: p.AckWait,
		MaxAckPending: p.MaxAckPending, Workers: p.Workers, AttemptTimeout: p.AttemptTimeout,
		BackoffMin: p.BackoffMin, BackoffMax: p.BackoffMax, DepthInterval: p.DepthInterval,
	}
}

// AllocationsConfig configures allocations (docs/allocations.md).
type AllocationsConfig struct {
	// MaxPerProject caps a project's live allocations (allocation_concurrency_limit).
	MaxPerProject int `env:"GANTRY_ALLOCATIONS_MAX_PER_PROJECT" envDefault:"16"`
	// ProvisioningTimeout is how long an allocation may wait for its node's agent.
	ProvisioningTimeout time.Duration `env:"GANTRY_PROVISIONING_TIMEOUT" envDefault:"10m"`
	// ReportTimeout is how long an agent that acknowledged a task (provision, release,
	// restart) may take to report its result before the task fails; checked every
	// ReportCheckInterval (0 turns the check off).
	ReportTimeout       time.Duration `env:"GANTRY_ALLOCATIONS_REPORT_TIMEOUT" envDefault:"30m"`
	ReportCheckInterval time.Duration `env:"GANTRY_ALLOCATIONS_REPORT_CHECK_INTERVAL" envDefault:"1m"`
	// PlacementHintTTL is how long a replica reuses one read of the placement
	// candidates for single launches (the claim re-checks everything); -1ns: never.
	PlacementHintTTL time.Duration `env:"GANTRY_ALLOCATIONS_PLACEMENT_HINT_TTL" envDefault:"250ms"`
	// Idle detection: every GPU under IdleUtilizationPercent for IdleAfter makes an
	// active allocation idle; checked every IdleCheckInterval (0 turns it off); samples
	// older than IdleSampleMaxAge are no evidence.
	IdleUtilizationPercent int           `env:"GANTRY_ALLOCATIONS_IDLE_UTILIZATION_PERCENT" envDefault:"5"`
	IdleAfter              time.Duration `env:"GANTRY_ALLOCATIONS_IDLE_AFTER" envDefault:"30m"`
	IdleCheckInterval      time.Duration `env:"GANTRY_ALLOCATIONS_IDLE_CHECK_INTERVAL" envDefault:"1m"`
	IdleSampleMaxAge       time.Duration `env:"GANTRY_ALLOCATIONS_IDLE_SAMPLE_MAX_AGE" envDefault:"5m"`
}

// siblingSubjectPrefix is a subject prefix beside the events prefix that the events
// stream does not capture: "gantry.events." gives "gantry.<name>.". Subjects under the
// events prefix would be stored by the events stream, and a NATS request published there
// would be answered by JetStream's publish ack instead of its real responder.
func (c Config) siblingSubjectPrefix(name string) string {
	root, ok := strings.CutSuffix(c.EventsSubjectPrefix, "events.")
	if !ok {
		root = "sibling." + c.EventsSubjectPrefix
	}
	return root + name + "."
}

// FabricConfig configures the node fabric server (docs/fabric.md). Fields left empty in
// a Config built by hand (tests, benchmarks) get values that cannot collide: an
// ephemeral port, and a bucket and subjects named after the events stream.
type FabricConfig struct {
	// Addr is where the fabric listens, UDP (QUIC) and TCP (TLS+yamux) on one port number.
	Addr string `env:"GANTRY_FABRIC_ADDR" envDefault:"127.0.0.1:7443"`
	// PublicAddr is the address handed to agents at enrollment; default: the bound address.
	PublicAddr string `env:"GANTRY_FABRIC_PUBLIC_ADDR"`
	// ReplicaID names this replica in node presence; default: the host name.
	ReplicaID string `env:"GANTRY_REPLICA_ID"`
	// PresenceBucket is the JetStream KV bucket of node presence.
	PresenceBucket string `env:"GANTRY_FABRIC_PRESENCE_BUCKET" envDefault:"gantry_fabric_presence"`
	// SubjectPrefix prefixes the NATS subjects replicas use between them.
	SubjectPrefix string `env:"GANTRY_FABRIC_SUBJECT_PREFIX" envDefault:"gantry.fabric."`
	// DisableUDP serves TLS+yamux only (UDP cannot reach the control plane).
	DisableUDP bool `env:"GANTRY_FABRIC_DISABLE_UDP" envDefault:"false"`
	// CertNames adds DNS names / IPs to the fabric server certificate (comma-separated).
	CertNames []string `env:"GANTRY_FABRIC_CERT_NAMES" envSeparator:","`
	// StartupTTL is the heartbeat TTL everyone gets right after a start (no offline
	// stampede while the fleet reconnects).
	StartupTTL time.Duration `env:"GANTRY_FABRIC_STARTUP_TTL" envDefault:"5m"`
}

// PaymentsConfig configures payments (docs/payments.md).
type PaymentsConfig struct {
	// ProviderBaseURL is the payment provider's API; ProviderAPIKey its secret key
	// (without one, top-ups answer service_unavailable).
	ProviderBaseURL string `env:"GANTRY_PAYMENTS_PROVIDER_BASE_URL" envDefault:"https://api.stripe.com"`
	ProviderAPIKey  string `env:"GANTRY_PAYMENTS_PROVIDER_API_KEY"`
	// WebhookSecrets are the webhook signing secrets, comma-separated; any one verifies
	// (list the new and the old secret while rotating).
	WebhookSecrets []string `env:"GANTRY_PAYMENTS_WEBHOOK_SECRETS" envSeparator:","`
	// RefundWindow: refunds later than this after capture are refund_window_exceeded.
	RefundWindow time.Duration `env:"GANTRY_PAYMENTS_REFUND_WINDOW" envDefault:"4320h"`
	// WebhookMaxBodyBytes caps a webhook body (refused unverified above it).
	WebhookMaxBodyBytes int64 `env:"GANTRY_PAYMENTS_WEBHOOK_MAX_BODY_BYTES" envDefault:"262144"`
	// Currencies top-ups may be made in, comma-separated.
	Currencies []string `env:"GANTRY_PAYMENTS_CURRENCIES" envSeparator:"," envDefault:"USD,EUR,GBP,JPY"`
	// ReconcileAfter: a payment quiet this long is read back from the provider.
	ReconcileAfter time.Duration `env:"GANTRY_PAYMENTS_RECONCILE_AFTER" envDefault:"15m"`
}

func (p PaymentsConfig) service() payments.Config {
	return payments.Config{
		ProviderBaseURL: p.ProviderBaseURL, ProviderAPIKey: p.ProviderAPIKey, WebhookSecrets: p.WebhookSecrets,
		RefundWindow: p.RefundWindow, WebhookMaxBody: p.WebhookMaxBodyBytes, Currencies: p.Currencies,
		ReconcileAfter: p.ReconcileAfter,
	}
}

// BudgetsConfig configures budgets (docs/budgets.md).
type BudgetsConfig struct {
	// EvaluateInterval is how often every active budget is evaluated (0 turns the loop off).
	EvaluateInterval time.Duration `env:"GANTRY_BUDGETS_EVALUATE_INTERVAL" envDefault:"1m"`
}

// BillingConfig configures billing (docs/billing.md).
type BillingConfig struct {
	// MinRunway: a launch needs the wallet to cover this long at the unit's price.
	MinRunway time.Duration `env:"GANTRY_BILLING_MIN_RUNWAY" envDefault:"1h"`
	// RunwayFloor: under it the watcher asks for the tenant's running workloads to stop.
	RunwayFloor time.Duration `env:"GANTRY_BILLING_RUNWAY_FLOOR" envDefault:"10m"`
	// WatchInterval is how often the runway watcher and the running-usage rater run.
	WatchInterval time.Duration `env:"GANTRY_BILLING_WATCH_INTERVAL" envDefault:"30s"`
}

func (b BillingConfig) service() billing.Config {
	return billing.Config{MinRunway: b.MinRunway, RunwayFloor: b.RunwayFloor, WatchInterval: b.WatchInterval}
}

// NodesConfig configures node administration (docs/nodes.md).
type NodesConfig struct {
	// ProbeAllowedCIDRs, when set, is an allowlist (comma-separated CIDRs) on top of the
	// fixed deny list of the node probe (seed: NODE_PROBE_ALLOWED_CIDRS).
	ProbeAllowedCIDRs string `env:"NODE_PROBE_ALLOWED_CIDRS"`
	// ProbePort is the TCP port probed when a node names none (its SSH port).
	ProbePort int `env:"GANTRY_NODE_PROBE_PORT" envDefault:"22"`
	// ProbeTimeout bounds one probe (resolution and connect).
	ProbeTimeout time.Duration `env:"GANTRY_NODE_PROBE_TIMEOUT" envDefault:"3s"`
	// EnrollmentTokenTTL is how long a one-time enrollment token stays usable.
	EnrollmentTokenTTL time.Duration `env:"GANTRY_NODE_ENROLLMENT_TOKEN_TTL" envDefault:"15m"`
	// TelemetryMinInterval is the least time between two stored routine GPU samples of a node.
	TelemetryMinInterval time.Duration `env:"GANTRY_NODE_TELEMETRY_MIN_INTERVAL" envDefault:"30s"`
}

func (n NodesConfig) service() nodes.Config {
	return nodes.Config{EnrollmentTokenTTL: n.EnrollmentTokenTTL, ProbePort: n.ProbePort, TelemetryMinInterval: n.TelemetryMinInterval}
}

// LoadConfig reads the environment. dev relaxes the master-key requirement.
func LoadConfig(dev bool) (Config, error) {
	cfg, err := env.ParseAs[Config]()
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	if cfg.Auth, err = auth.LoadConfig(dev); err != nil {
		return Config{}, err
	}
	if _, err := probe.ParseCIDRs(cfg.Nodes.ProbeAllowedCIDRs); err != nil {
		return Config{}, err
	}
	if _, err := cfg.RateLimitGroups(); err != nil {
		return Config{}, err
	}
	if err := cfg.checkJobRescue(); err != nil {
		return Config{}, err
	}
	if cfg.GCPercent != 0 && (cfg.GCPercent < MinGCPercent || cfg.GCPercent > MaxGCPercent) {
		return Config{}, fmt.Errorf("GANTRY_GC_PERCENT (%d) must be 0 (Go's default) or %d-%d", cfg.GCPercent, MinGCPercent, MaxGCPercent)
	}
	return cfg, nil
}

// The range GANTRY_GC_PERCENT accepts: below 50 the collector runs more than twice as
// often as Go's default, above 1000 the heap may grow to eleven times what is live.
const (
	MinGCPercent = 50
	MaxGCPercent = 1000
)

// ApplyGCPercent sets the process's garbage collector target to percent (Config.
// GCPercent) and reports the value in force. GOGC, when set, wins, and 0 keeps Go's
// default.
//
// Why not Go's default: the control plane's live heap is dominated by its tunnels (about
// 125 KiB each, docs/fabric.md) and it allocates the most when a fleet reconnects at once,
// the moment its CPU is scarcest. The collector's work per allocated byte is
// proportional to 100/GOGC, so 200 halves it; in the 10,000-agent restart bench the
// collector (its background workers and the assists charged to allocating goroutines)
// was about 15 % of the fabric server's CPU at 100. The price is memory: the heap may
// grow to three times the live heap between collections instead of two.
func ApplyGCPercent(percent int) int {
	if v := os.Getenv("GOGC"); v != "" || percent == 0 {
		old := debug.SetGCPercent(100)
		debug.SetGCPercent(old)
		return old
	}
	debug.SetGCPercent(percent)
	return percent
}

// checkJobRescue refuses a rescue delay River would refuse or never honour: a running job is left
// alone until its worker's timeout passed too, so a MAAS step of a killed replica resumes
// only after max(rescue, attempt timeout) whatever is set (docs/jobs.md).
func (c Config) checkJobRescue() error {
	r := c.Jobs.RescueStuckJobsAfter
	if r <= 0 {
		return nil
	}
	if r <= c.Maas.StepAttemptTimeout {
		return fmt.Errorf("GANTRY_JOBS_RESCUE_STUCK_AFTER (%s) must exceed GANTRY_MAAS_STEP_ATTEMPT_TIMEOUT (%s)", r, c.Maas.StepAttemptTimeout)
	}
	// River refuses a rescue delay below the default job timeout (1m unless set).
	if jt := c.Jobs.JobTimeout; r < jt || jt <= 0 && r < time.Minute {
		return fmt.Errorf("GANTRY_JOBS_RESCUE_STUCK_AFTER (%s) must be at least GANTRY_JOBS_JOB_TIMEOUT (default 1m)", r)
	}
	return nil
}

// RateLimitGroups applies GANTRY_RATE_LIMITS over the default groups.
func (c Config) RateLimitGroups() ([]ratelimit.Group, error) {
	groups := ratelimit.DefaultGroups()
	if strings.TrimSpace(c.RateLimits) == "" {
		return groups, nil
	}
	for _, part := range strings.Split(c.RateLimits, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		n, err := strconv.Atoi(val)
		if !ok || err != nil || n < 0 {
			return nil, fmt.Errorf("GANTRY_RATE_LIMITS: %q is not group=requests_per_minute", part)
		}
		found := false
		for i := range groups {
			if groups[i].Name == name {
				groups[i].PerMinute, found = n, true
			}
		}
		if !found {
			return nil, fmt.Errorf("GANTRY_RATE_LIMITS: unknown group %q", name)
		}
	}
	return groups, nil
}

// Level is the slog level of LogLevel.
func (c Config) Level() slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return slog.LevelInfo
	}
	return l
}

// MaasConfig is GANTRY_MAAS_* and GANTRY_NODEAGENT_PACKAGE (docs/maas.md).
type MaasConfig struct {
	// ControlPlaneURL is the URL machines MAAS deploys reach the control plane at
	// (default: http:// + GANTRY_HTTP_ADDR).
	ControlPlaneURL string `env:"GANTRY_MAAS_CONTROL_PLANE_URL"`
	// ServerCAFile pins the control plane's HTTPS CA on deployed machines (PEM file).
	ServerCAFile string `env:"GANTRY_MAAS_SERVER_CA_FILE"`
	// LogGatewayURL is where node agents ship their logs.
	LogGatewayURL string `env:"GANTRY_MAAS_LOG_GATEWAY_URL"`
	// SyncInterval is the scheduled sync of every site.
	SyncInterval time.Duration `env:"GANTRY_MAAS_SYNC_INTERVAL" envDefault:"5m"`
	// PollInterval is how often waiting workflow steps look again.
	PollInterval time.Duration `env:"GANTRY_MAAS_POLL_INTERVAL" envDefault:"5s"`
	// CallTimeout bounds one MAAS API call.
	CallTimeout time.Duration `env:"GANTRY_MAAS_CALL_TIMEOUT" envDefault:"30s"`
	// StepAttemptTimeout bounds one run of a step's job; GANTRY_JOBS_RESCUE_STUCK_AFTER
	// must exceed it (docs/jobs.md).
	StepAttemptTimeout time.Duration `env:"GANTRY_MAAS_STEP_ATTEMPT_TIMEOUT" envDefault:"3m"`
	// StepTimeouts overrides step timeouts: "deploy=10m,wait_deployed=45m".
	StepTimeouts string `env:"GANTRY_MAAS_STEP_TIMEOUTS"`
	// PackagePath is the node agent .deb served at /api/v1/node-agent/package.
	PackagePath string `env:"GANTRY_NODEAGENT_PACKAGE"`
}

// stepTimeouts parses StepTimeouts.
func (m MaasConfig) stepTimeouts() (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	for _, kv := range strings.Split(m.StepTimeouts, ",") {
		if strings.TrimSpace(kv) == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if !ok || err != nil || d < 0 {
			return nil, fmt.Errorf("GANTRY_MAAS_STEP_TIMEOUTS: %q is not step=duration", kv)
		}
		out[strings.TrimSpace(k)] = d
	}
	return out, nil
}
