package agent

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/gantry-gpu/gantry/nodeagent/gpu"
	"github.com/gantry-gpu/gantry/nodeagent/logship"
	"github.com/gantry-gpu/gantry/nodeagent/runtime"
	"github.com/gantry-gpu/gantry/nodeagent/tasks"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// Defaults used until the control plane's Welcome says otherwise.
const (
	DefaultHeartbeatInterval = 10 * time.Second
	DefaultTelemetryInterval = 15 * time.Second
	DefaultHandshakeTimeout  = 30 * time.Second
	// Intervals the control plane sends are clamped to this range, so a bad value can
	// neither flood the tunnel nor silence the node.
	minInterval = 50 * time.Millisecond
	maxInterval = 10 * time.Minute
	// DefaultResultResend is how often results the control plane has not acknowledged
	// are sent again on a tunnel that stays up (they are always sent again after a
	// reconnect).
	DefaultResultResend = 30 * time.Second
)

// StreamHandler serves a raw stream the control plane opened (terminal, app proxy). It
// must answer the preamble with fabricnet.WriteReply before payload bytes flow, and
// close st when done. ctx ends when the tunnel does.
type StreamHandler interface {
	ServeStream(ctx context.Context, pre *fabricv1.StreamPreamble, st net.Conn)
}

// ReportSource is what the agent sends as ControllerReports: the latest report of every
// object a controller on the node manages. Reports are not acknowledged; a report lost
// with a tunnel goes out again on the next one (and every ReportInterval).
type ReportSource interface {
	Reports() []*fabricv1.ControllerReport
	Changed() <-chan struct{}
	ReportInterval() time.Duration
}

// Options configure an Agent. Addr, TLS, Token and GPU are required.
type Options struct {
	Addr        string         // fabric host:port
	Transport   fabricnet.Mode // auto (default), quic or tcp
	TLS         *tls.Config    // trusts the fabric CA
	DialOptions *fabricnet.DialOptions
	// Token returns the node bearer token; it is called on every connect, so a token
	// rotated on disk is picked up without a restart.
	Token        func() (string, error)
	AgentVersion string
	// AgentCommit is the source commit the agent was built from (build info metric).
	AgentCommit string
	Hostname    string
	GPU         gpu.Backend
	// Executor runs dispatched tasks; each task id runs once (the agent wraps it in
	// tasks.Once). nil rejects every task as an unsupported kind.
	Executor tasks.Executor
	// StateDir, when set, is where results wait for the control plane's acknowledgement
	// (<StateDir>/results), so they survive an agent restart; "" keeps them in memory
	// only (tests). RunConfig sets it to the runtime's state directory.
	StateDir string
	// Workloads, when set, lists the workloads the node holds; every Hello reports them
	// for the control plane's reconcile. nil reports none (and says so).
	Workloads func() []runtime.Held
	// ResultResend spaces re-sends of unacknowledged results on a tunnel that stays up
	// (default DefaultResultResend).
	ResultResend time.Duration
	// Streams serves control-plane-opened raw streams; nil refuses them.
	Streams StreamHandler
	// Reports, when set, supplies controller reports (the app supervisor,
	// nodeagent/apps): all of them go out on every new tunnel and every
	// ReportInterval, and the changed ones whenever Changed fires.
	Reports ReportSource
	// OnConnection, when set, is told the gRPC connection of every established tunnel
	// (after the Welcome) and nil when that tunnel ends, so other services on the
	// tunnel (StorageFabric, nodeagent/storagemount) always call through the current one.
	OnConnection func(cc grpc.ClientConnInterface)
	// OnTunnel is OnConnection with the tunnel's session too (nil, nil, nil when it
	// ends): StorageFabric reads open raw streams on it (storagemount.Conns.SetTunnel).
	// side, when not nil, opens a bulk side session beside it: given for a QUIC
	// tunnel whose control plane offers them (bulkSideDialer).
	OnTunnel func(cc grpc.ClientConnInterface, sess fabricnet.Session, side fabricnet.SideDialer)
	// LogStats, when set, reports the log shipper's counters for the agent's metrics.
	LogStats func() logship.Stats
	// Backoff spaces reconnects; the zero value means DefaultBackoff.
	Backoff Backoff
	// HeartbeatInterval and TelemetryInterval apply until the Welcome.
	HeartbeatInterval time.Duration
	TelemetryInterval time.Duration
	// HandshakeTimeout bounds dial + auth + hello/welcome.
	HandshakeTimeout time.Duration
	Clock            clock.Clock
	Logger           *slog.Logger
	// OnRetry, when set, is told each wait before a reconnect attempt (tests assert the
	// backoff bound with it; it must return quickly).
	OnRetry func(attempt int, delay time.Duration, err error)
}

// Status is a snapshot of the agent's connection, for the CLI and tests.
type Status struct {
	Connected         bool
	NodeID            string
	SessionID         string
	ReplicaID         string
	Transport         string // "quic" or "tcp" while connected
	Sessions          int    // tunnels established (Welcome received) since start
	Attempts          int    // failed attempts since the last established tunnel
	LastError         string
	ConnectedAt       time.Time
	HeartbeatInterval time.Duration
	TelemetryInterval time.Duration
	HeartbeatsSent    uint64
	TelemetrySent     uint64
	InventorySent     uint64 // Inventory messages after Hello (changes)
	ReportsSent       uint64 // ControllerReports
}

// Agent is one node agent. Run it once.
type Agent struct {
	o      Options
	once   *tasks.Once
	bootID string
	log    *slog.Logger

	mu         sync.Mutex
	st         Status
	lastInv    gpu.Inventory
	results    resultStore
	unreported map[string]*fabricv1.TaskResult // finished, not acknowledged (also on disk)
	sent       map[string]bool                 // of unreported, sent on the current tunnel
	notify     chan struct{}                   // a task finished: send its result
	hbSeq      uint64
	// For the metrics: failed or ended tunnels, and the last GPU sample.
	reconnects   uint64
	lastSamples  []gpu.Metrics
	lastSampleAt time.Time
	metrics      *metrics

	tasksWG sync.WaitGroup
}

// New checks o and returns an Agent.
func New(o Options) (*Agent, error) {
	if o.Addr == "" || o.TLS == nil || o.Token == nil || o.GPU == nil {
		return nil, errors.New("agent: Addr, TLS, Token and GPU are required")
	}
	if o.Transport == "" {
		o.Transport = fabricnet.ModeAuto
	}
	if o.Executor == nil {
		o.Executor = tasks.NewMux()
	}
	if o.Backoff.Min <= 0 || o.Backoff.Max < o.Backoff.Min {
		r := o.Backoff.Rand
		o.Backoff = DefaultBackoff()
		o.Backoff.Rand = r
	}
	if o.HeartbeatInterval <= 0 {
		o.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if o.TelemetryInterval <= 0 {
		o.TelemetryInterval = DefaultTelemetryInterval
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.ResultResend <= 0 {
		o.ResultResend = DefaultResultResend
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	a := &Agent{
		o:          o,
		once:       tasks.NewOnce(o.Executor, 0),
		bootID:     hex.EncodeToString(b[:]),
		log:        o.Logger,
		unreported: map[string]*fabricv1.TaskResult{},
		sent:       map[string]bool{},
		notify:     make(chan struct{}, 1),
	}
	a.metrics = newMetrics(a)
	if o.StateDir != "" {
		a.results = resultStore{dir: filepath.Join(o.StateDir, "results")}
	}
	// Results a previous run finished and the control plane never acknowledged: they go
	// out on the first tunnel.
	if err := a.results.init(); err != nil {
		return nil, fmt.Errorf("agent: results directory: %w", err)
	}
	pending, bad, err := a.results.all()
	if err != nil {
		return nil, err
	}
	for _, path := range bad {
		a.log.Error("task result file unreadable, moved aside; the control plane settles its task by timeout", "path", path)
	}
	for _, r := range pending {
		a.unreported[r.GetTaskId()] = r
	}
	if len(pending) > 0 {
		a.log.Info("task results awaiting acknowledgement reloaded", "results", len(pending))
	}
	return a, nil
}

// PendingResults lists the task ids whose results wait for the control plane's
// acknowledgement, sorted.
func (a *Agent) PendingResults() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	ids := make([]string, 0, len(a.unreported))
	for id := range a.unreported {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Status returns a snapshot.
func (a *Agent) Status() Status {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.st
}

// Executions is how many tasks the executor actually ran (redeliveries excluded).
func (a *Agent) Executions() int { return a.once.Executions() }

// Run connects and keeps reconnecting until ctx ends, then closes the tunnel, waits for
// running tasks to observe the cancellation, and returns nil. It returns an error only
// for a configuration that can never work.
func (a *Agent) Run(ctx context.Context) error {
	defer a.tasksWG.Wait()
	attempt := 0
	// lastEnd is when the last established tunnel ended (zero: none yet); it caps the
	// backoff while the control plane restarts (Backoff.Retry).
	var lastEnd time.Time
	busyStreak := 0 // consecutive attempts refused as busy (Backoff.BusyDelay)
	for {
		established, ended, err := a.session(ctx)
		if ctx.Err() != nil {
			a.setDisconnected("")
			a.log.Info("agent stopped")
			return nil
		}
		since := time.Duration(-1)
		if !lastEnd.IsZero() {
			since = a.o.Clock.Now().Sub(lastEnd)
		}
		busy := !established && fabricnet.ServerBusy(err)
		delay := a.o.Backoff.Retry(attempt, since)
		if busy {
			delay = a.o.Backoff.BusyDelay(busyStreak)
			busyStreak++
		} else {
			busyStreak = 0
		}
		if established {
			lastEnd = a.o.Clock.Now()
			attempt = 0
			delay = a.o.Backoff.Delay(0)
			if fabricnet.FleetWideEnd(ended) {
				delay = a.o.Backoff.SpreadDelay()
			}
			switch {
			case ended != nil && err == nil:
				err = ended
			case ended != nil:
				err = fmt.Errorf("%w (tunnel: %v)", err, ended)
			}
		}
		if errors.Is(err, fabricnet.ErrTokenRefused) {
			// Retrying sooner will not help; the token file may be replaced by a
			// re-enrollment, which the next attempt picks up.
			delay = a.o.Backoff.Delay(1 << 10)
			a.log.Error("node token refused by the control plane; re-enroll this node (gantry-nodeagent enroll)", "retry_in", delay)
		} else {
			a.log.Warn("fabric tunnel down", "err", err, "retry_in", delay, "attempt", attempt)
		}
		if a.o.OnRetry != nil {
			a.o.OnRetry(attempt, delay, err)
		}
		if !busy {
			attempt++ // a busy refusal does not escalate the backoff (Backoff.BusyDelay)
		}
		a.mu.Lock()
		a.reconnects++
		a.st.Attempts = attempt
		a.mu.Unlock()
		a.setDisconnected(errString(err))
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			a.setDisconnected("")
			a.log.Info("agent stopped")
			return nil
		case <-t.C:
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func (a *Agent) setDisconnected(lastErr string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.st.Connected = false
	a.st.Transport = ""
	a.st.SessionID = ""
	a.st.ReplicaID = ""
	if lastErr != "" {
		a.st.LastError = lastErr
	}
}

// session runs one tunnel from dial to its end. established is true once the Welcome
// arrived (the backoff restarts from Min after such a tunnel ends); ended is then why
// the tunnel ended (fabricnet.Session.Err, read before this side closes it; nil when
// the agent ended it).
func (a *Agent) session(ctx context.Context) (established bool, ended error, err error) {
	hctx, hcancel := context.WithTimeout(ctx, a.o.HandshakeTimeout)
	defer hcancel()

	sess, err := fabricnet.Dial(hctx, a.o.Addr, a.o.Transport, a.o.TLS, a.o.DialOptions)
	if err != nil {
		return false, nil, fmt.Errorf("dial %s: %w", a.o.Addr, err)
	}
	closeReason := "agent reconnecting"
	defer func() {
		if ctx.Err() != nil {
			closeReason = "agent shutting down"
		} else if ended = sess.Err(); ended == nil {
			// The control stream can fail a moment before quic-go records why the
			// connection ended.
			t := time.NewTimer(100 * time.Millisecond)
			select {
			case <-sess.Done():
				ended = sess.Err()
			case <-t.C:
			}
			t.Stop()
		}
		_ = sess.Close(closeReason)
	}()

	tok, err := a.o.Token()
	if err != nil {
		return false, nil, fmt.Errorf("node token: %w", err)
	}
	auth, err := fabricnet.Authenticate(hctx, sess, &fabricv1.AuthRequest{Token: tok, AgentVersion: a.o.AgentVersion, ProtocolVersion: fabricnet.ProtocolVersion})
	if err != nil {
		return false, nil, err
	}

	cc, err := fabricnet.GRPCClient(sess)
	if err != nil {
		return false, nil, fmt.Errorf("grpc client: %w", err)
	}
	defer cc.Close()

	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	go func() {
		select {
		case <-sess.Done():
			scancel()
		case <-sctx.Done():
		}
	}()
	// The handshake deadline also bounds the Welcome wait, which Recv cannot take a
	// context for: past it the whole session is cancelled. Stopped once welcomed.
	stopHandshakeGuard := context.AfterFunc(hctx, scancel)
	defer stopHandshakeGuard()

	go a.acceptStreams(sctx, sess)

	ctl, err := fabricv1.NewFabricClient(cc).Control(sctx)
	if err != nil {
		return false, nil, fmt.Errorf("control stream: %w", err)
	}
	inv, err := a.o.GPU.Inventory(hctx)
	if err != nil {
		return false, nil, fmt.Errorf("gpu inventory: %w", err)
	}
	hello := &fabricv1.Hello{
		AgentVersion:  a.o.AgentVersion,
		Hostname:      a.o.Hostname,
		Inventory:     toProtoInventory(inv),
		BootId:        a.bootID,
		ActiveTaskIds: a.activeTaskIDs(),
	}
	if a.o.Workloads != nil {
		hello.WorkloadsReported = true
		for _, w := range a.o.Workloads() {
			hello.Workloads = append(hello.Workloads, &fabricv1.HeldWorkload{AllocationId: w.AllocationID, Phase: string(w.Phase)})
		}
	}
	// Every unacknowledged result goes out again on this tunnel.
	a.mu.Lock()
	clear(a.sent)
	a.mu.Unlock()
	if err := ctl.Send(&fabricv1.AgentMessage{Msg: &fabricv1.AgentMessage_Hello{Hello: hello}}); err != nil {
		return false, nil, fmt.Errorf("send hello: %w", err)
	}
	first, err := ctl.Recv()
	if err != nil {
		return false, nil, fmt.Errorf("await welcome: %w", err)
	}
	welcome := first.GetWelcome()
	if welcome == nil {
		return false, nil, errors.New("control plane did not answer hello with welcome")
	}
	established = true
	stopHandshakeGuard()
	if a.o.OnConnection != nil {
		a.o.OnConnection(cc)
		defer a.o.OnConnection(nil)
	}
	if a.o.OnTunnel != nil {
		a.o.OnTunnel(cc, sess, a.bulkSideDialer(sess, auth, tok))
		defer a.o.OnTunnel(nil, nil, nil)
	}

	hb, tel := a.o.HeartbeatInterval, a.o.TelemetryInterval
	hb, tel = applyHeartbeatConfig(welcome.GetHeartbeat(), hb, tel)
	a.mu.Lock()
	a.lastInv = inv
	a.st.Connected = true
	a.st.NodeID = firstNonEmpty(welcome.GetNodeId(), auth.GetNodeId())
	a.st.SessionID = firstNonEmpty(welcome.GetSessionId(), auth.GetSessionId())
	a.st.ReplicaID = welcome.GetReplicaId()
	a.st.Transport = string(sess.Transport())
	a.st.Sessions++
	a.st.Attempts = 0
	a.st.ConnectedAt = a.o.Clock.Now()
	a.st.HeartbeatInterval, a.st.TelemetryInterval = hb, tel
	a.mu.Unlock()
	a.log.Info("fabric tunnel up", "node_id", a.st.NodeID, "session_id", welcome.GetSessionId(),
		"transport", sess.Transport(), "replica", welcome.GetReplicaId(), "heartbeat", hb, "telemetry", tel)

	return true, nil, a.serve(ctx, sctx, ctl, hb, tel)
}

// bulkSideDialer returns how bulk streams leave the tunnel (fabricnet.SideDialer), or
// nil when they stay on sess. A control plane that takes bulk connections
// (AuthResponse.bulk_connections) gets them on either transport: each raw stream its own
// TLS+TCP connection, with no multiplexer between the stream and TLS (yamux's copies and
// handoffs were about a fifth of an attachment read's CPU, docs/storage.md). Else a QUIC
// tunnel whose control plane offers side sessions gets one: quic-go costs about 2.4
// times the CPU per byte of TLS+TCP. Both dial the tunnel's address over TCP with the
// same TLS settings and node token (re-read, in case it was rotated on disk), naming the
// tunnel's session.
func (a *Agent) bulkSideDialer(sess fabricnet.Session, auth *fabricv1.AuthResponse, tok string) fabricnet.SideDialer {
	if auth.GetSessionId() == "" {
		return nil
	}
	req := func() *fabricv1.AuthRequest {
		t, err := a.o.Token()
		if err != nil {
			t = tok
		}
		return &fabricv1.AuthRequest{
			Token: t, AgentVersion: a.o.AgentVersion, ProtocolVersion: fabricnet.ProtocolVersion, BulkForSessionId: auth.GetSessionId(),
		}
	}
	if auth.GetBulkConnections() {
		dial := func(ctx context.Context) (fabricnet.Session, error) {
			return fabricnet.DialBulkConn(ctx, a.o.Addr, a.o.TLS, a.o.DialOptions, req())
		}
		return func(ctx context.Context) (fabricnet.Session, error) {
			conns, err := fabricnet.NewBulkConns(ctx, dial)
			if err != nil {
				a.log.Info("bulk connections not available; bulk reads stay on the tunnel for now", "err", err)
				return nil, err
			}
			a.log.Debug("bulk connections up", "session_id", auth.GetSessionId())
			return conns, nil
		}
	}
	if sess.Transport() != fabricnet.TransportQUIC || !auth.GetBulkSideSessions() {
		return nil
	}
	return func(ctx context.Context) (fabricnet.Session, error) {
		side, err := fabricnet.DialBulkSide(ctx, a.o.Addr, a.o.TLS, a.o.DialOptions, req())
		if err != nil {
			a.log.Info("bulk side session not available; bulk reads stay on the QUIC tunnel for now", "err", err)
			return nil, err
		}
		a.log.Debug("bulk side session up", "session_id", auth.GetSessionId())
		return side, nil
	}
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func applyHeartbeatConfig(c *fabricv1.HeartbeatConfig, hb, tel time.Duration) (time.Duration, time.Duration) {
	clamp := func(d time.Duration) time.Duration { return min(max(d, minInterval), maxInterval) }
	if c == nil {
		return hb, tel
	}
	if d := c.GetInterval().AsDuration(); d > 0 {
		hb = clamp(d)
	}
	if d := c.GetTelemetryInterval().AsDuration(); d > 0 {
		tel = clamp(d)
	}
	return hb, tel
}

// serve is the established tunnel: one goroutine reads control messages, this loop is
// the only writer on the control stream (gRPC streams allow one sender at a time).
func (a *Agent) serve(ctx, sctx context.Context, ctl fabricv1.Fabric_ControlClient, hb, tel time.Duration) error {
	in := make(chan *fabricv1.ControlMessage, 16)
	readErr := make(chan error, 1)
	go func() {
		for {
			m, err := ctl.Recv()
			if err != nil {
				readErr <- err
				return
			}
			select {
			case in <- m:
			case <-sctx.Done():
				return
			}
		}
	}()

	hbTick := time.NewTicker(hb)
	defer hbTick.Stop()
	telTick := time.NewTicker(tel)
	defer telTick.Stop()
	resendTick := time.NewTicker(a.o.ResultResend)
	defer resendTick.Stop()

	// Health events (XIDs) trigger a sample at once, at most one per second.
	var events <-chan struct{}
	if n, ok := a.o.GPU.(gpu.Notifier); ok {
		events = n.Changed()
	}
	var lastSample time.Time
	eventTimer := time.NewTimer(time.Hour)
	eventTimer.Stop()
	defer eventTimer.Stop()
	eventArmed := false

	send := func(m *fabricv1.AgentMessage) error {
		if err := ctl.Send(m); err != nil {
			return fmt.Errorf("send: %w", err)
		}
		return nil
	}
	// A first sample right away, so the fleet view is filled without waiting an interval;
	// then whatever results finished while the tunnel was down.
	if err := a.sendTelemetry(sctx, send); err != nil {
		return err
	}
	lastSample = time.Now()
	if err := a.flushResults(send); err != nil {
		return err
	}
	// Controller reports: all of them on this new tunnel, then what changes, and all
	// again every ReportInterval.
	var reportsChanged <-chan struct{}
	var reportTick <-chan time.Time
	sentReports := map[string]reportKey{}
	if a.o.Reports != nil {
		reportsChanged = a.o.Reports.Changed()
		t := time.NewTicker(max(a.o.Reports.ReportInterval(), minInterval))
		defer t.Stop()
		reportTick = t.C
		if err := a.sendReports(send, sentReports, true); err != nil {
			return err
		}
	}
	for {
		select {
		case <-sctx.Done():
			if ctx.Err() != nil {
				_ = ctl.CloseSend()
				return ctx.Err()
			}
			return errors.New("tunnel closed")
		case err := <-readErr:
			return fmt.Errorf("control stream: %w", err)
		case <-hbTick.C:
			a.mu.Lock()
			a.hbSeq++
			seq := a.hbSeq
			a.st.HeartbeatsSent++
			a.mu.Unlock()
			if err := send(&fabricv1.AgentMessage{Msg: &fabricv1.AgentMessage_Heartbeat{Heartbeat: &fabricv1.Heartbeat{Seq: seq, SentAt: ts(a.o.Clock.Now())}}}); err != nil {
				return err
			}
		case <-telTick.C:
			if err := a.sendTelemetry(sctx, send); err != nil {
				return err
			}
			lastSample = time.Now()
		case <-events:
			if eventArmed {
				continue
			}
			eventArmed = true
			eventTimer.Reset(max(0, time.Second-time.Since(lastSample)))
		case <-eventTimer.C:
			eventArmed = false
			if err := a.sendTelemetry(sctx, send); err != nil {
				return err
			}
			lastSample = time.Now()
		case <-a.notify:
			if err := a.flushResults(send); err != nil {
				return err
			}
		case <-reportsChanged:
			if err := a.sendReports(send, sentReports, false); err != nil {
				return err
			}
		case <-reportTick:
			if err := a.sendReports(send, sentReports, true); err != nil {
				return err
			}
		case <-resendTick.C:
			// Sent but never acknowledged on this tunnel (the control plane could not
			// record it yet, or lost it): send them again.
			a.mu.Lock()
			clear(a.sent)
			a.mu.Unlock()
			if err := a.flushResults(send); err != nil {
				return err
			}
		case m := <-in:
			switch msg := m.GetMsg().(type) {
			case *fabricv1.ControlMessage_HeartbeatConfig:
				nhb, ntel := applyHeartbeatConfig(msg.HeartbeatConfig, hb, tel)
				if nhb != hb {
					hb = nhb
					hbTick.Reset(hb)
				}
				if ntel != tel {
					tel = ntel
					telTick.Reset(tel)
				}
				a.mu.Lock()
				a.st.HeartbeatInterval, a.st.TelemetryInterval = hb, tel
				a.mu.Unlock()
				a.log.Debug("heartbeat config changed", "heartbeat", hb, "telemetry", tel)
			case *fabricv1.ControlMessage_Task:
				if err := send(&fabricv1.AgentMessage{Msg: &fabricv1.AgentMessage_TaskAck{TaskAck: a.dispatch(ctx, msg.Task)}}); err != nil {
					return err
				}
				// A duplicate of a finished task gets its result again (the first report
				// may have been lost with the previous tunnel).
				if err := a.flushResults(send); err != nil {
					return err
				}
			case *fabricv1.ControlMessage_ResultAck:
				a.acknowledged(msg.ResultAck.GetTaskId())
			case *fabricv1.ControlMessage_Welcome:
				// Only the first message may be a Welcome; a second one is ignored.
			}
		}
	}
}

// sendTelemetry samples every GPU, and re-sends the inventory first when it changed
// since the last one the control plane saw.
func (a *Agent) sendTelemetry(ctx context.Context, send func(*fabricv1.AgentMessage) error) error {
	inv, err := a.o.GPU.Inventory(ctx)
	if err != nil {
		a.log.Warn("gpu inventory failed", "err", err)
	} else {
		a.mu.Lock()
		changed := !inv.Equal(a.lastInv)
		a.mu.Unlock()
		if changed {
			if err := send(&fabricv1.AgentMessage{Msg: &fabricv1.AgentMessage_Inventory{Inventory: toProtoInventory(inv)}}); err != nil {
				return err
			}
			a.mu.Lock()
			a.lastInv = inv
			a.st.InventorySent++
			a.mu.Unlock()
			a.log.Info("gpu inventory changed", "gpus", len(inv.GPUs))
		}
	}
	samples, err := a.o.GPU.Sample(ctx)
	if err != nil {
		// A sampling failure is logged, not fatal to the tunnel: heartbeats still say
		// the node is alive, and the fleet view shows stale metrics.
		a.log.Warn("gpu sample failed", "err", err)
		return nil
	}
	if err := send(&fabricv1.AgentMessage{Msg: &fabricv1.AgentMessage_Telemetry{Telemetry: toProtoTelemetry(samples)}}); err != nil {
		return err
	}
	a.mu.Lock()
	a.st.TelemetrySent++
	a.lastSamples, a.lastSampleAt = samples, a.o.Clock.Now()
	a.mu.Unlock()
	return nil
}

// reportKey is what makes a controller report different from the one sent before.
type reportKey struct {
	generation uint64
	state      string
	message    string
}

// sendReports sends every report (all) or those that differ from what this tunnel
// carried last (sent, keyed by controller and object).
func (a *Agent) sendReports(send func(*fabricv1.AgentMessage) error, sent map[string]reportKey, all bool) error {
	for _, r := range a.o.Reports.Reports() {
		k := r.GetController() + "/" + r.GetObjectId()
		key := reportKey{r.GetGeneration(), r.GetState(), r.GetMessage()}
		if !all && sent[k] == key {
			continue
		}
		if err := send(&fabricv1.AgentMessage{Msg: &fabricv1.AgentMessage_ControllerReport{ControllerReport: r}}); err != nil {
			return err
		}
		sent[k] = key
		a.mu.Lock()
		a.st.ReportsSent++
		a.mu.Unlock()
	}
	return nil
}
