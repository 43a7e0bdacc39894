package logship

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grafana/loki/pkg/push"

	"github.com/gantry-gpu/gantry/shared/clock"
)

// Defaults of Config.
const (
	DefaultBatchBytes    = 1 << 20
	DefaultBatchWait     = time.Second
	DefaultMaxAge        = 10 * time.Minute
	DefaultQueueBytes    = 8 << 20
	DefaultMaxLineBytes  = 64 << 10
	DefaultSpoolMaxBytes = 64 << 20
	DefaultMinBackoff    = 500 * time.Millisecond
	DefaultMaxBackoff    = 2 * time.Minute
	DefaultPushTimeout   = 30 * time.Second
)

// pushPath is the gateway's one operation.
const pushPath = "/loki/api/v1/push"

// Config configures a Shipper. Zero values take the defaults above.
type Config struct {
	// GatewayURL is the log gateway's base URL (GANTRY_LOGGATEWAY_URL).
	GatewayURL string
	// Token returns the node bearer token for each push (it may rotate).
	Token func() string
	// Labels are added to every stream (e.g. job="gantry-nodeagent"). The gateway stamps
	// node_id itself; a node_id here is ignored there.
	Labels map[string]string
	// SpoolDir keeps sealed batches on disk until they are delivered; empty keeps them in
	// memory (lost when the agent stops).
	SpoolDir      string
	SpoolMaxBytes int64
	// BatchBytes and BatchWait seal a batch by size of its lines, or by the time since its
	// first line.
	BatchBytes int
	BatchWait  time.Duration
	// MaxAge: events older than this are dropped before a push.
	MaxAge time.Duration
	// QueueBytes bounds lines added but not yet batched; past it lines are dropped.
	QueueBytes   int64
	MaxLineBytes int
	MinBackoff   time.Duration
	MaxBackoff   time.Duration
	PushTimeout  time.Duration
	// Journalctl is the journalctl binary FollowJournal runs ("journalctl").
	Journalctl string

	Clock      clock.Clock
	HTTPClient *http.Client
	// Logger reports the shipper's own trouble (it may itself feed the shipper).
	Logger *slog.Logger
	// Sleep waits between retries; tests inject one that records the waits.
	Sleep func(ctx context.Context, d time.Duration) error
}

func (c *Config) defaults() {
	if c.BatchBytes <= 0 {
		c.BatchBytes = DefaultBatchBytes
	}
	if c.BatchWait <= 0 {
		c.BatchWait = DefaultBatchWait
	}
	if c.MaxAge <= 0 {
		c.MaxAge = DefaultMaxAge
	}
	if c.QueueBytes <= 0 {
		c.QueueBytes = DefaultQueueBytes
	}
	if c.MaxLineBytes <= 0 {
		c.MaxLineBytes = DefaultMaxLineBytes
	}
	if c.SpoolMaxBytes <= 0 {
		c.SpoolMaxBytes = DefaultSpoolMaxBytes
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.PushTimeout <= 0 {
		c.PushTimeout = DefaultPushTimeout
	}
	if c.Journalctl == "" {
		c.Journalctl = "journalctl"
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Sleep == nil {
		c.Sleep = sleep
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stats are the shipper's counters since it started.
type Stats struct {
	// Events added and accepted into the queue.
	Queued int64
	// Events delivered to the gateway, and the pushes that carried them.
	Sent, SentBatches int64
	// Events dropped: queue full, older than MaxAge before a push, spool full (oldest
	// batch evicted), refused by the gateway for good (400/413).
	DroppedQueueFull, DroppedTooOld, DroppedSpoolFull, DroppedRejected int64
	// Retries is the number of failed pushes that were retried.
	Retries int64
	// Truncated lines longer than MaxLineBytes.
	Truncated int64
}

type stats struct {
	queued, sent, sentBatches                               atomic.Int64
	droppedQueue, droppedOld, droppedSpool, droppedRejected atomic.Int64
	retries, truncated                                      atomic.Int64
}

// Shipper collects, batches, spools and pushes log lines. Create with New, start with
// Run; adding lines before Run is fine (they wait in the queue).
type Shipper struct {
	cfg     Config
	pushURL string
	static  map[string]string
	queue   chan event
	queued  atomic.Int64 // bytes in queue
	spool   *spool
	stats   stats

	runOnce sync.Once
}

// event is one line on its way into a batch.
type event struct {
	stream string // rendered label set
	ts     time.Time
	line   string
	meta   push.LabelsAdapter
	size   int64
}

// New checks cfg and opens the spool (picking up batches a previous run left there).
func New(cfg Config) (*Shipper, error) {
	cfg.defaults()
	u, err := url.Parse(cfg.GatewayURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("logship: GatewayURL must be an http(s) URL")
	}
	if cfg.Token == nil {
		return nil, errors.New("logship: a Token source is required")
	}
	s := &Shipper{
		cfg:     cfg,
		pushURL: strings.TrimRight(cfg.GatewayURL, "/") + pushPath,
		static:  cfg.Labels,
		// The channel bounds the count of queued events; QueueBytes bounds their bytes.
		queue: make(chan event, 16384),
	}
	s.spool, err = openSpool(cfg.SpoolDir, cfg.SpoolMaxBytes, func(n int) { s.stats.droppedSpool.Add(int64(n)) })
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Stats returns the counters.
func (s *Shipper) Stats() Stats {
	return Stats{
		Queued: s.stats.queued.Load(), Sent: s.stats.sent.Load(), SentBatches: s.stats.sentBatches.Load(),
		DroppedQueueFull: s.stats.droppedQueue.Load(), DroppedTooOld: s.stats.droppedOld.Load(),
		DroppedSpoolFull: s.stats.droppedSpool.Load(), DroppedRejected: s.stats.droppedRejected.Load(),
		Retries: s.stats.retries.Load(), Truncated: s.stats.truncated.Load(),
	}
}

// Stream is a label set lines are added under, rendered once.
type Stream struct{ labels string }

// Stream returns the stream with labels plus the configured static labels.
func (s *Shipper) Stream(labels map[string]string) Stream {
	all := make(map[string]string, len(s.static)+len(labels))
	for k, v := range s.static {
		all[k] = v
	}
	for k, v := range labels {
		all[k] = v
	}
	return Stream{labels: renderLabels(all)}
}

func renderLabels(m map[string]string) string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(strconv.Quote(m[k]))
	}
	b.WriteByte('}')
	return b.String()
}

// Log adds a line stamped now. It never blocks: false means the line was dropped
// (queue full) and counted.
func (s *Shipper) Log(st Stream, line string, meta ...push.LabelAdapter) bool {
	return s.LogAt(st, s.cfg.Clock.Now(), line, meta...)
}

// LogAt adds a line with its own timestamp (journald's, for instance).
func (s *Shipper) LogAt(st Stream, ts time.Time, line string, meta ...push.LabelAdapter) bool {
	if len(line) > s.cfg.MaxLineBytes {
		line = line[:s.cfg.MaxLineBytes]
		s.stats.truncated.Add(1)
	}
	size := int64(len(line) + 16)
	for _, m := range meta {
		size += int64(len(m.Name) + len(m.Value))
	}
	if s.queued.Add(size) > s.cfg.QueueBytes {
		s.queued.Add(-size)
		s.stats.droppedQueue.Add(1)
		return false
	}
	ev := event{stream: st.labels, ts: ts, line: line, meta: meta, size: size}
	select {
	case s.queue <- ev:
		s.stats.queued.Add(1)
		return true
	default:
		s.queued.Add(-size)
		s.stats.droppedQueue.Add(1)
		return false
	}
}

// Run batches and pushes until ctx ends; then it seals what is queued into the spool and
// makes one last attempt to deliver the spool (at most the push timeout). Call it once.
func (s *Shipper) Run(ctx context.Context) error {
	started := false
	s.runOnce.Do(func() { started = true })
	if !started {
		return errors.New("logship: Run called twice")
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.batch(ctx)
	}()
	s.send(ctx)
	wg.Wait()
	// Last attempt: what was sealed on the way out, without retries.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.PushTimeout)
	defer cancel()
	s.drain(fctx)
	return nil
}
