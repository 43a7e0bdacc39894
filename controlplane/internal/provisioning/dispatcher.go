package provisioning

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/controlplane/internal/fabric"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/alloctask"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/correlation"
)

// Fabric delivers a task to a node's agent wherever its tunnel is (implemented by
// *fabric.Server): the agent's ack, fabric.ErrNodeOffline or fabric.ErrDispatchTimeout.
type Fabric interface {
	Dispatch(ctx context.Context, nodeID uuid.UUID, task *fabricv1.TaskDispatch) (*fabricv1.TaskAck, error)
}

// Tasks is what the dispatcher asks of allocations (implemented by
// *allocations.Service; dispatch.go there says what each call decides).
type Tasks interface {
	DispatchTask(ctx context.Context, taskID uuid.UUID) (allocations.DispatchTask, error)
	TaskAcknowledged(ctx context.Context, taskID uuid.UUID, attempt int) (bool, error)
	TaskUndelivered(ctx context.Context, taskID uuid.UUID, attempt int, cause string) error
	TaskRejected(ctx context.Context, taskID uuid.UUID, attempt int, code, message string) (bool, error)
	TaskExpired(ctx context.Context, taskID uuid.UUID, attempt int) (bool, error)
}

var _ Tasks = (*allocations.Service)(nil)

// Dispatcher consumes the provisioning stream and delivers each task to its node's agent.
type Dispatcher struct {
	js      jetstream.JetStream
	tasks   Tasks
	fabric  Fabric
	clock   clock.Clock
	cfg     Config
	metrics *Metrics
	log     *slog.Logger
	// rnd draws the backoff jitter.
	rnd func() float64
}

// New returns a dispatcher; metrics nil gets unregistered metrics, log nil discards.
// The clock decides deadlines (tests move it past a task's deadline).
func New(js jetstream.JetStream, tasks Tasks, fab Fabric, clk clock.Clock, cfg Config, metrics *Metrics, log *slog.Logger) *Dispatcher {
	if metrics == nil {
		metrics, _ = NewMetrics(nil)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if clk == nil {
		clk = clock.Real{}
	}
	cfg = cfg.withDefaults()
	// Exposed from the start (0 until the first refresh), so an alert can tell "no lag"
	// from "no dispatcher".
	metrics.ConsumerLag.WithLabelValues(cfg.Stream)
	return &Dispatcher{
		js: js, tasks: tasks, fabric: fab, clock: clk, cfg: cfg, metrics: metrics,
		log: log.With("component", "provisioning"), rnd: rand.Float64,
	}
}

// Config is the configuration in force (defaults applied).
func (d *Dispatcher) Config() Config { return d.cfg }

// Metrics are the dispatcher's metrics.
func (d *Dispatcher) Metrics() *Metrics { return d.metrics }

// Run consumes until ctx ends, then stops taking messages, hands back the ones it had
// not started, and waits for the deliveries in flight. Every replica runs it; the
// durable consumer splits the messages between them. Losing NATS or the consumer is
// retried, never fatal.
func (d *Dispatcher) Run(ctx context.Context) error {
	refreshed := make(chan struct{})
	defer func() { <-refreshed }()
	go func() { defer close(refreshed); d.refreshLoop(ctx) }()
	for ctx.Err() == nil {
		if err := d.consume(ctx); err != nil && ctx.Err() == nil {
			d.log.WarnContext(ctx, "provisioning dispatcher stopped consuming; retrying", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

// consume runs one consumer subscription until ctx ends or it closes.
func (d *Dispatcher) consume(ctx context.Context) error {
	cons, err := d.EnsureConsumer(ctx)
	if err != nil {
		return err
	}
	// Deliveries outlive Run's context: one that started finishes (its writes commit and
	// its message is acknowledged) rather than leaving a half-done delivery to AckWait.
	work := context.WithoutCancel(ctx)
	slots := make(chan struct{}, d.cfg.Workers)
	var wg sync.WaitGroup
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if ctx.Err() != nil {
			// Shutting down: hand it straight back to the other replicas.
			_ = m.Nak()
			return
		}
		// Blocks the consume loop when every worker is busy: back-pressure, not a
		// growing pile of goroutines.
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			d.Handle(work, m)
		}()
	}, jetstream.PullMaxMessages(d.cfg.Workers), jetstream.ConsumeErrHandler(func(c jetstream.ConsumeContext, err error) {
		d.log.DebugContext(ctx, "provisioning consumer", "err", err)
		if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
			// Someone deleted the consumer: end this subscription; Run creates it again.
			c.Stop()
		}
	}))
	if err != nil {
		return fmt.Errorf("consume %s: %w", d.cfg.Stream, err)
	}
	select {
	case <-ctx.Done():
		cc.Drain()
		<-cc.Closed()
	case <-cc.Closed():
	}
	wg.Wait()
	if ctx.Err() == nil {
		return errors.New("consumer closed")
	}
	return nil
}

// EnsureConsumer creates or updates the durable consumer every replica shares.
func (d *Dispatcher) EnsureConsumer(ctx context.Context) (jetstream.Consumer, error) {
	cons, err := d.js.CreateOrUpdateConsumer(ctx, d.cfg.Stream, consumerConfig(d.cfg))
	if err != nil {
		return nil, fmt.Errorf("consumer %s on %s: %w", d.cfg.Consumer, d.cfg.Stream, err)
	}
	return cons, nil
}

// refreshLoop reads the queue metrics every DepthInterval.
func (d *Dispatcher) refreshLoop(ctx context.Context) {
	t := time.NewTicker(d.cfg.DepthInterval)
	defer t.Stop()
	for {
		if err := d.RefreshDepth(ctx); err != nil && ctx.Err() == nil {
			d.log.DebugContext(ctx, "provisioning queue depth", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// RefreshDepth reads the consumer's state into provisioning_queue_depth and
// nats_consumer_lag.
func (d *Dispatcher) RefreshDepth(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cons, err := d.js.Consumer(ctx, d.cfg.Stream, d.cfg.Consumer)
	if err != nil {
		return err
	}
	info := cons.CachedInfo()
	d.metrics.QueueDepth.Set(float64(info.NumPending) + float64(info.NumAckPending))
	d.metrics.ConsumerLag.WithLabelValues(d.cfg.Stream).Set(float64(info.NumPending))
	return nil
}

// Handle delivers the task of one message and settles the message: acknowledged when
// the task reached its agent, was refused, timed out or needs nothing any more; handed
// back with a delay when it could not be delivered yet; terminated when it can never be
// read.
func (d *Dispatcher) Handle(ctx context.Context, m jetstream.Msg) {
	attempt := 1
	if md, err := m.Metadata(); err == nil && md.NumDelivered > 0 {
		attempt = int(min(md.NumDelivered, 1<<31-1))
	}
	var dm allocations.DispatchMessage
	taskID, err := uuid.Nil, json.Unmarshal(m.Data(), &dm)
	if err == nil {
		taskID, err = uuid.Parse(dm.TaskID)
	}
	if err != nil {
		d.log.WarnContext(ctx, "unreadable provisioning message dropped", "subject", m.Subject(), "err", err)
		_ = m.Term()
		return
	}
	ctx = correlation.Extract(ctx, m.Headers().Get)
	log := d.log.With("task_id", taskID, "allocation_id", dm.AllocationID, "node_id", dm.NodeID, "task_kind", dm.Kind, "attempt", attempt)

	t, err := d.tasks.DispatchTask(ctx, taskID)
	if errors.Is(err, allocations.ErrUnknownTask) {
		log.WarnContext(ctx, "provisioning message for an unknown task dropped")
		_ = m.Term()
		return
	}
	if err != nil {
		d.retry(ctx, log, m, attempt, time.Time{}, "load task", err)
		return
	}
	if !t.Pending() {
		// Acknowledged earlier (a redelivery after a lost ack), reported, or overtaken:
		// nothing to send, and certainly not twice.
		log.DebugContext(ctx, "task needs no delivery", "settled", t.Settled)
		_ = m.Ack()
		return
	}
	if !d.clock.Now().Before(t.Deadline) {
		d.expire(ctx, log, m, t, attempt)
		return
	}

	payload, err := json.Marshal(t.Payload)
	if err != nil {
		d.retry(ctx, log, m, attempt, t.Deadline, "encode payload", err)
		return
	}
	task := &fabricv1.TaskDispatch{
		TaskId: t.TaskID.String(), Kind: t.Kind, Payload: payload, ContentType: alloctask.ContentType,
		Attempt: uint32(attempt), Deadline: timestamppb.New(t.Deadline),
		CorrelationId: m.Headers().Get(correlation.HeaderEventCorrelation), Traceparent: m.Headers().Get("traceparent"),
	}
	dctx, cancel := context.WithTimeout(ctx, d.cfg.AttemptTimeout)
	ack, err := d.fabric.Dispatch(dctx, t.NodeID, task)
	cancel()
	if err != nil {
		d.undelivered(ctx, log, m, t, attempt, err)
		return
	}
	switch ack.GetStatus() {
	case fabricv1.TaskAckStatus_TASK_ACK_STATUS_ACCEPTED, fabricv1.TaskAckStatus_TASK_ACK_STATUS_DUPLICATE:
		recorded, err := d.tasks.TaskAcknowledged(ctx, t.TaskID, attempt)
		if err != nil {
			// The agent has it; the redelivery will get DUPLICATE and record it then.
			d.retry(ctx, log, m, attempt, time.Time{}, "record acknowledgement", err)
			return
		}
		if recorded {
			d.metrics.DispatchLatency.Observe(max(d.clock.Now().Sub(t.CreatedAt), 0).Seconds())
		}
		log.DebugContext(ctx, "task acknowledged by the agent", "ack", ack.GetStatus().String())
		_ = m.Ack()
	case fabricv1.TaskAckStatus_TASK_ACK_STATUS_REJECTED:
		done, err := d.tasks.TaskRejected(ctx, t.TaskID, attempt, ack.GetErrorCode(), ack.GetMessage())
		if err != nil {
			d.retry(ctx, log, m, attempt, time.Time{}, "record refusal", err)
			return
		}
		if done {
			d.metrics.Failures.Inc()
		}
		log.WarnContext(ctx, "task refused by the agent", "code", ack.GetErrorCode(), "message", ack.GetMessage())
		_ = m.Ack()
	default:
		d.undelivered(ctx, log, m, t, attempt, fmt.Errorf("unexpected ack status %s", ack.GetStatus()))
	}
}

// undelivered records a delivery that did not reach the agent and hands the message
// back for a later attempt.
func (d *Dispatcher) undelivered(ctx context.Context, log *slog.Logger, m jetstream.Msg, t allocations.DispatchTask, attempt int, cause error) {
	reason := "dispatch_error: " + cause.Error()
	switch {
	case errors.Is(cause, fabric.ErrNodeOffline):
		reason = "node_offline: no replica holds a tunnel to the node"
	case errors.Is(cause, fabric.ErrDispatchTimeout):
		reason = fmt.Sprintf("dispatch_timeout: the agent did not acknowledge within %s", d.cfg.AttemptTimeout)
	}
	if err := d.tasks.TaskUndelivered(ctx, t.TaskID, attempt, reason); err != nil {
		log.WarnContext(ctx, "recording a delivery attempt failed", "err", err)
	}
	d.retry(ctx, log, m, attempt, t.Deadline, "deliver", cause)
}

// retry hands the message back after the attempt's backoff, bounded by deadline when
// known (zero: not known, e.g. the database did not answer).
func (d *Dispatcher) retry(ctx context.Context, log *slog.Logger, m jetstream.Msg, attempt int, deadline time.Time, step string, cause error) {
	rnd := d.rnd()
	delay := backoff(attempt, d.cfg.BackoffMin, d.cfg.BackoffMax, rnd)
	if !deadline.IsZero() {
		delay = retryDelay(attempt, d.cfg.BackoffMin, d.cfg.BackoffMax, rnd, d.clock.Now(), deadline)
	}
	// The first failure and every tenth after it at info: an offline node's tasks would
	// otherwise log every few seconds each until their deadline.
	level := slog.LevelDebug
	if attempt%10 == 1 {
		level = slog.LevelInfo
	}
	log.Log(ctx, level, "provisioning task not delivered; retrying", "step", step, "err", cause, "retry_in", delay)
	if err := m.NakWithDelay(delay); err != nil {
		log.WarnContext(ctx, "handing a provisioning message back failed (redelivered after AckWait)", "err", err)
	}
}

// expire fails a task whose deadline passed before any agent acknowledged it.
func (d *Dispatcher) expire(ctx context.Context, log *slog.Logger, m jetstream.Msg, t allocations.DispatchTask, attempt int) {
	done, err := d.tasks.TaskExpired(ctx, t.TaskID, attempt)
	if err != nil {
		d.retry(ctx, log, m, attempt, time.Time{}, "record timeout", err)
		return
	}
	if done {
		d.metrics.Timeouts.Inc()
		log.WarnContext(ctx, "task not acknowledged before its deadline; allocation failed", "deadline", t.Deadline)
	}
	_ = m.Ack()
}
