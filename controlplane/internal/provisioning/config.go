package provisioning

import (
	"strings"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
)

// Defaults of Config.
const (
	DefaultStream         = "PROVISIONING"
	DefaultSubjectPrefix  = "gantry.provisioning."
	DefaultConsumer       = "provisioning-dispatcher"
	DefaultAckWait        = time.Minute
	DefaultMaxAckPending  = 10000
	DefaultWorkers        = 64
	DefaultAttemptTimeout = 15 * time.Second
	DefaultBackoffMin     = time.Second
	DefaultBackoffMax     = 30 * time.Second
	DefaultDepthInterval  = 15 * time.Second
	// DuplicateWindow is the stream's Nats-Msg-Id dedupe window: a relay that
	// re-publishes an outbox row after a crash within it adds nothing.
	DuplicateWindow = 10 * time.Minute
	// MaxAge bounds how long an undelivered message stays in the stream; far beyond
	// any provisioning timeout, so only a dispatcher down for a week loses work.
	MaxAge = 7 * 24 * time.Hour
)

// StoredPrefix is the subject prefix the outbox stores dispatch messages under
// (allocations.DispatchSubject); the relay maps it onto Config.SubjectPrefix (Route).
const StoredPrefix = "gantry.provisioning."

// Config configures the stream and the dispatcher (GANTRY_PROVISIONING_*); zero values
// take the defaults.
type Config struct {
	// Stream is the JetStream stream (default PROVISIONING).
	Stream string
	// SubjectPrefix is the stream's subject prefix; it captures SubjectPrefix + ">".
	SubjectPrefix string
	// Consumer is the durable consumer every replica shares (work is split between them).
	Consumer string
	// AckWait is how long a delivered message may stay unacknowledged before JetStream
	// hands it to another replica; at least twice AttemptTimeout.
	AckWait time.Duration
	// MaxAckPending bounds the messages delivered and not yet acknowledged, all
	// replicas together. Messages waiting for a retry count: with that many tasks of
	// offline nodes waiting, new tasks queue behind them until some time out, so it is
	// sized for a fleet-wide outage (a waiting message costs the server little).
	MaxAckPending int
	// Workers bounds the deliveries one replica runs at once.
	Workers int
	// AttemptTimeout bounds one delivery: the fabric dispatch waiting for the agent's ack.
	AttemptTimeout time.Duration
	// BackoffMin and BackoffMax bound the retry delay of an undelivered task: BackoffMin
	// doubling per attempt up to BackoffMax, jittered, and never past the task's deadline.
	BackoffMin, BackoffMax time.Duration
	// DepthInterval is how often the queue metrics are read from the consumer.
	DepthInterval time.Duration
}

func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if c.Stream == "" {
		c.Stream = DefaultStream
	}
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = DefaultSubjectPrefix
	}
	if !strings.HasSuffix(c.SubjectPrefix, ".") {
		c.SubjectPrefix += "."
	}
	if c.Consumer == "" {
		c.Consumer = DefaultConsumer
	}
	if c.MaxAckPending <= 0 {
		c.MaxAckPending = DefaultMaxAckPending
	}
	if c.Workers <= 0 {
		c.Workers = DefaultWorkers
	}
	def(&c.AttemptTimeout, DefaultAttemptTimeout)
	def(&c.AckWait, DefaultAckWait)
	// A message must not be handed to another replica while this one is still waiting
	// for the agent: that would be a second delivery of the same task at the same time.
	c.AckWait = max(c.AckWait, 2*c.AttemptTimeout)
	def(&c.BackoffMin, DefaultBackoffMin)
	def(&c.BackoffMax, DefaultBackoffMax)
	c.BackoffMax = max(c.BackoffMax, c.BackoffMin)
	def(&c.DepthInterval, DefaultDepthInterval)
	return c
}

// Subject is the subject dispatch messages are published on (what the consumer reads).
func (c Config) Subject() string {
	c = c.withDefaults()
	return c.SubjectPrefix + strings.TrimPrefix(allocations.DispatchSubject, StoredPrefix)
}

// Route is the outbox relay route that publishes the stored dispatch messages onto this
// stream's subjects (outbox.Relay.Routes).
func (c Config) Route() outbox.Route {
	return outbox.Route{From: StoredPrefix, To: c.withDefaults().SubjectPrefix}
}
