// Package fabrictest is a simulated node agent built only on shared/fabricnet and the
// fabric proto: what the fabric tests and gantry-bench connect with, and a worked
// example of the agent side of the protocol (dial, authenticate, Hello, heartbeats,
// task acks, raw streams, reconnect with jittered exponential backoff).
package fabrictest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// Agent is a simulated node agent.
type Agent struct {
	Addr  string
	Token string
	CA    *x509.CertPool
	Mode  fabricnet.Mode
	// Dial overrides fabricnet.DialOptions (e.g. a short QUIC fallback in tests).
	Dial *fabricnet.DialOptions
	// Inventory is sent in Hello.
	Inventory *fabricv1.Inventory
	// Workloads, when not nil, are the held workloads every Hello reports.
	Workloads []*fabricv1.HeldWorkload
	// BackoffMin / BackoffMax bound the reconnect backoff (defaults 100ms / 5s).
	BackoffMin, BackoffMax time.Duration
	// OnTask answers a dispatched task (default: ACCEPTED, DUPLICATE for a repeat id).
	OnTask func(*fabricv1.TaskDispatch) *fabricv1.TaskAck
	// ReconnectSpread, when set, delays the first reconnect after an established
	// session ends by a random time in [0, ReconnectSpread) when the whole fleet may
	// have learnt of the end at the same moment (fabricnet.FleetWideEnd: a graceful
	// stop; on TLS+yamux, a crash too), like the real agent's Backoff.Spread. A QUIC
	// tunnel ended by a stateless reset or an idle timeout (a crash) is not delayed:
	// the fleet comes back spread over the keep-alive interval already, and a spread
	// on top only makes the last agents later.
	ReconnectSpread time.Duration
	// OnRetry, when set, is called before every wait between two attempts: established
	// says whether the attempt reached a Welcome, ended why its tunnel ended (nil when it
	// never came up), err why the attempt failed, delay how long the agent now waits (the
	// bench's histogram of attempts and backoff).
	OnRetry func(established bool, ended, err error, delay time.Duration)
	// HeartbeatOverride, when set, replaces the interval the server hands out.
	HeartbeatOverride time.Duration
	// NoHeartbeats stops sending heartbeats (to test the TTL).
	NoHeartbeats atomic.Bool
	// NoResumption dials every tunnel with a full TLS handshake. By default the agent
	// keeps a session cache across its reconnects and resumes, as the real agent does
	// (nodeagent/config TLSConfig).
	NoResumption bool

	// Sessions receives one Connection per established session (Welcome received).
	Sessions chan Connection
	// Refused is closed when the control plane refused the token.
	Refused chan struct{}

	refuseOnce sync.Once
	mu         sync.Mutex
	cur        fabricnet.Session
	seen       map[string]bool
	send       func(*fabricv1.AgentMessage) error // the current tunnel's, nil between tunnels
	results    map[string]*fabricv1.TaskResult    // sent after every Welcome until acknowledged
	acked      []string
	heartbeats atomic.Int64
	tlsOnce    sync.Once
	tlsConf    *tls.Config
}

// tls is the agent's TLS configuration, the same across its reconnects so that they
// share the session cache.
func (a *Agent) tls() *tls.Config {
	a.tlsOnce.Do(func() {
		a.tlsConf = &tls.Config{RootCAs: a.CA}
		if !a.NoResumption {
			a.tlsConf.ClientSessionCache = tls.NewLRUClientSessionCache(1)
		}
	})
	return a.tlsConf
}

// Connection describes one established session.
type Connection struct {
	Welcome   *fabricv1.Welcome
	Transport fabricnet.Transport
	Session   fabricnet.Session
}

// NewAgent returns an agent for addr, authenticating with token and trusting caPEM.
func NewAgent(addr, token string, caPEM []byte, mode fabricnet.Mode) *Agent {
	cp := x509.NewCertPool()
	cp.AppendCertsFromPEM(caPEM)
	return &Agent{
		Addr: addr, Token: token, CA: cp, Mode: mode,
		Sessions: make(chan Connection, 64), Refused: make(chan struct{}),
		seen: map[string]bool{},
		Inventory: &fabricv1.Inventory{Gpus: []*fabricv1.GPU{{
			Index: 0, Uuid: "GPU-00000000-0000-0000-0000-000000000001", Model: "NVIDIA H100 80GB HBM3",
			MemoryBytes: 80 << 30, DriverVersion: "550.54.15", CudaVersion: "12.4", PciBusId: "00000000:18:00.0",
			MigMode: fabricv1.MIGMode_MIG_MODE_DISABLED,
		}}},
	}
}

// Heartbeats is how many heartbeats were sent.
func (a *Agent) Heartbeats() int64 { return a.heartbeats.Load() }

// AddResult keeps r until the control plane acknowledges it, like the real agent: it is
// sent now when a tunnel is up, and again after every Welcome.
func (a *Agent) AddResult(r *fabricv1.TaskResult) {
	a.mu.Lock()
	if a.results == nil {
		a.results = map[string]*fabricv1.TaskResult{}
	}
	a.results[r.GetTaskId()] = r
	send := a.send
	a.mu.Unlock()
	if send != nil {
		_ = send(&fabricv1.AgentMessage{Msg: &fabricv1.AgentMessage_TaskResult{TaskResult: r}})
	}
}

// Acked lists the task ids whose results the control plane acknowledged, in order.
func (a *Agent) Acked() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.acked...)
}

// Unacknowledged lists the results still waiting for their acknowledgement.
func (a *Agent) Unacknowledged() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, 0, len(a.results))
	for id := range a.results {
		out = append(out, id)
	}
	return out
}

// Current is the live session, if any.
func (a *Agent) Current() fabricnet.Session {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cur
}

// Run connects and stays connected until ctx ends or the token is refused,
// reconnecting with jittered exponential backoff.
func (a *Agent) Run(ctx context.Context) error {
	minB, maxB := a.BackoffMin, a.BackoffMax
	if minB <= 0 {
		minB = 100 * time.Millisecond
	}
	if maxB <= 0 {
		maxB = 5 * time.Second
	}
	backoff := minB
	busyStreak := 0
	for ctx.Err() == nil {
		established, ended, err := a.once(ctx)
		if errors.Is(err, fabricnet.ErrTokenRefused) {
			a.refuseOnce.Do(func() { close(a.Refused) })
			return err
		}
		// Jitter: anywhere in [backoff/2, backoff).
		d := backoff/2 + time.Duration(rand.Int64N(int64(backoff/2)+1))
		busy := !established && fabricnet.ServerBusy(err)
		if busy && a.ReconnectSpread > 0 {
			// Refused by a busy control plane: a random wait within 1 s, 2 s, 4 s ...
			// up to the spread, the backoff not escalating (the real agent's
			// Backoff.BusyDelay).
			w := min(time.Second<<min(busyStreak, 16), a.ReconnectSpread)
			d = time.Duration(rand.Int64N(int64(w)))
			busyStreak++
		} else {
			busyStreak = 0
		}
		if established {
			backoff = minB
			d = minB/2 + time.Duration(rand.Int64N(int64(minB/2)+1))
			if a.ReconnectSpread > 0 && fabricnet.FleetWideEnd(ended) {
				d = time.Duration(rand.Int64N(int64(a.ReconnectSpread)))
			}
		}
		if a.OnRetry != nil {
			a.OnRetry(established, ended, err, d)
		}
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
		if !busy {
			backoff = min(backoff*2, maxB)
		}
	}
	return ctx.Err()
}

// once runs one session to its end; established says whether a Welcome arrived, and
// ended, for an established session, why its tunnel ended (Session.Err; nil when the
// agent stopped while the tunnel was up).
func (a *Agent) once(ctx context.Context) (established bool, ended error, err error) {
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	sess, err := fabricnet.Dial(dctx, a.Addr, a.Mode, a.tls(), a.Dial)
	cancel()
	if err != nil {
		return false, nil, err
	}
	defer func() {
		// Read before this side's own close, which would be the reason otherwise. The
		// control stream can fail a moment before quic-go records why the connection
		// ended; a session that failed on its own (a gRPC error) ends here, locally.
		if ended = sess.Err(); ended == nil && ctx.Err() == nil {
			select {
			case <-sess.Done():
				ended = sess.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
		_ = sess.Close("agent done")
	}()
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	_, err = fabricnet.Authenticate(actx, sess, &fabricv1.AuthRequest{Token: a.Token, AgentVersion: "sim/1"})
	cancel()
	if err != nil {
		return false, nil, err
	}
	a.mu.Lock()
	a.cur = sess
	a.mu.Unlock()
	go a.serveRaw(sess)

	cc, err := fabricnet.GRPCClient(sess)
	if err != nil {
		return false, nil, err
	}
	defer cc.Close()
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		select {
		case <-sess.Done():
			stop()
		case <-sctx.Done():
		}
	}()
	ctl, err := fabricv1.NewFabricClient(cc).Control(sctx)
	if err != nil {
		return false, nil, err
	}
	var sendMu sync.Mutex
	send := func(m *fabricv1.AgentMessage) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return ctl.Send(m)
	}
	if err := send(&fabricv1.AgentMessage{Msg: &fabricv1.AgentMessage_Hello{Hello: &fabricv1.Hello{
		AgentVersion: "sim/1", Hostname: "sim", Inventory: a.Inventory, BootId: "boot",
		Workloads: a.Workloads, WorkloadsReported: a.Workloads != nil,
	}}}); err != nil {
		return false, nil, err
	}
	first, err := ctl.Recv()
	if err != nil {
		return false, nil, err
	}
	w := first.GetWelcome()
	if w == nil {
		return false, nil, errors.New("fabrictest: first control message is not a welcome")
	}
	select {
	case a.Sessions <- Connection{Welcome: w, Transport: sess.Transport(), Session: sess}:
	default:
	}
	interval := make(chan time.Duration, 1)
	interval <- w.GetHeartbeat().GetInterval().AsDuration()
	go a.heartbeat(sctx, send, interval)
	a.mu.Lock()
	a.send = send
	pending := make([]*fabricv1.TaskResult, 0, len(a.results))
	for _, r := range a.results {
		pending = append(pending, r)
	}
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.send = nil
		a.mu.Unlock()
	}()
	for _, r := range pending {
		if err := send(&fabricv1.AgentMessage{Msg: &fabricv1.AgentMessage_TaskResult{TaskResult: r}}); err != nil {
			return true, nil, err
		}
	}
	for {
		m, err := ctl.Recv()
		if err != nil {
			return true, nil, err
		}
		switch msg := m.Msg.(type) {
		case *fabricv1.ControlMessage_HeartbeatConfig:
			select {
			case <-interval:
			default:
			}
			interval <- msg.HeartbeatConfig.GetInterval().AsDuration()
		case *fabricv1.ControlMessage_ResultAck:
			a.mu.Lock()
			if _, ok := a.results[msg.ResultAck.GetTaskId()]; ok {
				delete(a.results, msg.ResultAck.GetTaskId())
				a.acked = append(a.acked, msg.ResultAck.GetTaskId())
			}
			a.mu.Unlock()
		case *fabricv1.ControlMessage_Task:
			ack := a.ack(msg.Task)
			if err := send(&fabricv1.AgentMessage{Msg: &fabricv1.AgentMessage_TaskAck{TaskAck: ack}}); err != nil {
				return true, nil, err
			}
		}
	}
}

func (a *Agent) ack(t *fabricv1.TaskDispatch) *fabricv1.TaskAck {
	if a.OnTask != nil {
		return a.OnTask(t)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.seen[t.GetTaskId()] {
		return &fabricv1.TaskAck{TaskId: t.GetTaskId(), Status: fabricv1.TaskAckStatus_TASK_ACK_STATUS_DUPLICATE}
	}
	a.seen[t.GetTaskId()] = true
	return &fabricv1.TaskAck{TaskId: t.GetTaskId(), Status: fabricv1.TaskAckStatus_TASK_ACK_STATUS_ACCEPTED}
}

func (a *Agent) heartbeat(ctx context.Context, send func(*fabricv1.AgentMessage) error, interval chan time.Duration) {
	d := <-interval
	if a.HeartbeatOverride > 0 {
		d = a.HeartbeatOverride
	}
	t := time.NewTimer(d)
	defer t.Stop()
	var seq uint64
	for {
		select {
		case <-ctx.Done():
			return
		case nd := <-interval:
			if a.HeartbeatOverride <= 0 {
				d = nd
			}
			t.Reset(d)
		case <-t.C:
			if !a.NoHeartbeats.Load() {
				seq++
				if send(&fabricv1.AgentMessage{Msg: &fabricv1.AgentMessage_Heartbeat{Heartbeat: &fabricv1.Heartbeat{
					Seq: seq, SentAt: timestamppb.Now(),
				}}}) != nil {
					return
				}
				a.heartbeats.Add(1)
			}
			t.Reset(d)
		}
	}
}

// serveRaw answers raw streams: TERMINAL and APP_PROXY streams echo what they receive.
func (a *Agent) serveRaw(sess fabricnet.Session) {
	for {
		st, err := sess.AcceptStream(context.Background())
		if err != nil {
			return
		}
		go func(st net.Conn) {
			defer st.Close()
			pre, err := fabricnet.ReadPreamble(st)
			if err != nil {
				return
			}
			if pre.GetKind() == fabricv1.StreamKind_STREAM_KIND_UNSPECIFIED {
				_ = fabricnet.WriteReply(st, &fabricv1.StreamReply{ErrorCode: "unsupported_kind"})
				return
			}
			if fabricnet.WriteReply(st, &fabricv1.StreamReply{Ok: true}) != nil {
				return
			}
			_, _ = io.Copy(st, st)
		}(st)
	}
}
