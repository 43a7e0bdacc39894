package fabric

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// controlService serves fabricv1.Fabric on agent-opened streams.
type controlService struct {
	fabricv1.UnimplementedFabricServer
	s *Server
}

func sessionOf(ctx context.Context) (*session, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, false
	}
	a, ok := p.Addr.(sessionAddr)
	return a.ss, ok
}

// Control runs the agent's control stream: Hello -> Welcome, then heartbeats,
// inventory, telemetry, acks and reports in; HeartbeatConfig and tasks out.
func (c *controlService) Control(stream fabricv1.Fabric_ControlServer) error {
	s := c.s
	ss, ok := sessionOf(stream.Context())
	if !ok {
		return status.Error(codes.Unauthenticated, "not a fabric tunnel")
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return status.Error(codes.InvalidArgument, "first message must be hello")
	}
	call := &controlCall{out: make(chan *fabricv1.ControlMessage, 16), done: make(chan struct{})}
	defer close(call.done)

	ctx := stream.Context()
	now := s.deps.Clock.Now()
	ss.touch(now)
	if err := s.nodeHello(ctx, ss, hello, now); err != nil {
		s.deps.Log.Warn("fabric: hello not recorded", "node_id", ss.nodeID, "err", err)
		return status.Error(codes.Unavailable, "hello not recorded; retry")
	}
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		return status.Error(codes.Unavailable, "session ended")
	}
	ss.ctl = call // a newer Control call on the same tunnel takes over
	hb := ss.hb
	ss.mu.Unlock()

	welcome := &fabricv1.ControlMessage{Msg: &fabricv1.ControlMessage_Welcome{Welcome: &fabricv1.Welcome{
		NodeId: ss.nodeID.String(), SessionId: ss.id.String(), ReplicaId: s.cfg.ReplicaID,
		Heartbeat: hb.proto(), ServerTime: timestamppb.New(now),
	}}}
	if err := stream.Send(welcome); err != nil {
		return err
	}
	if s.deps.OnHello != nil {
		// Off the receive loop: the agent's pending results (sent right after the
		// Welcome) are recorded meanwhile, and either order ends the same.
		go func() {
			if err := s.deps.OnHello(ctx, ss.nodeID, hello); err != nil && ctx.Err() == nil {
				s.deps.Log.Warn("fabric: reconcile after hello failed", "node_id", ss.nodeID, "err", err)
			}
		}()
	}

	sendErr := make(chan error, 1)
	go func() {
		for {
			select {
			case m := <-call.out:
				if err := stream.Send(m); err != nil {
					sendErr <- err
					return
				}
			case <-ctx.Done():
				return
			case <-ss.done:
				return
			}
		}
	}()
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			s.handleAgentMessage(ctx, ss, m)
		}
	}()
	select {
	case err := <-sendErr:
		return err
	case err := <-recvErr:
		return err
	case <-ss.done:
		return status.Error(codes.Unavailable, "session ended")
	}
}

func (h heartbeat) proto() *fabricv1.HeartbeatConfig {
	return &fabricv1.HeartbeatConfig{
		Interval: durationpb.New(h.interval), Ttl: durationpb.New(h.ttl), TelemetryInterval: durationpb.New(h.telemetry),
	}
}

// nodeHello records a Hello: inventory (when it changed), online status, presence.
func (s *Server) nodeHello(ctx context.Context, ss *session, h *fabricv1.Hello, now time.Time) error {
	inv := h.GetInventory()
	if inv == nil {
		inv = &fabricv1.Inventory{}
	}
	ss.mu.Lock()
	ss.agentVersion, ss.hostname = h.GetAgentVersion(), h.GetHostname()
	ss.mu.Unlock()
	if ss.setInventory(inv) {
		if err := s.deps.Directory.NodeConnected(ctx, ss.nodeID, fleetInventory(h.GetAgentVersion(), h.GetHostname(), inv), now); err != nil {
			ss.mu.Lock()
			ss.inventory = nil
			ss.mu.Unlock()
			return err
		}
	}
	// A new tunnel is always worth telling the directory about (it writes only on a
	// change); heartbeats never are.
	if err := s.deps.Directory.NodeStatus(ctx, ss.nodeID, true, now); err != nil {
		return err
	}
	ss.mu.Lock()
	ss.hello = true
	ss.mu.Unlock()
	s.writeSessionPresence(ctx, ss, true)
	return nil
}

func (s *Server) handleAgentMessage(ctx context.Context, ss *session, m *fabricv1.AgentMessage) {
	now := s.deps.Clock.Now()
	ss.touch(now)
	switch msg := m.Msg.(type) {
	case *fabricv1.AgentMessage_Heartbeat:
		// Memory only: presence is refreshed by the sweep, at most every PresenceRefresh.
	case *fabricv1.AgentMessage_Inventory:
		if ss.setInventory(msg.Inventory) {
			if err := s.deps.Directory.NodeConnected(ctx, ss.nodeID, fleetInventory(ss.agentVersion, ss.hostname, msg.Inventory), now); err != nil {
				s.deps.Log.Warn("fabric: inventory not recorded", "node_id", ss.nodeID, "err", err)
			}
		}
	case *fabricv1.AgentMessage_Telemetry:
		if err := s.deps.Directory.NodeTelemetry(ctx, ss.nodeID, fleetMetrics(msg.Telemetry)); err != nil {
			s.deps.Log.Warn("fabric: telemetry not recorded", "node_id", ss.nodeID, "err", err)
		}
	case *fabricv1.AgentMessage_TaskAck:
		ss.mu.Lock()
		ch := ss.pending[msg.TaskAck.GetTaskId()]
		delete(ss.pending, msg.TaskAck.GetTaskId())
		ss.mu.Unlock()
		if ch != nil {
			ch <- msg.TaskAck
		}
	case *fabricv1.AgentMessage_TaskResult:
		s.recordTaskResult(ctx, ss, msg.TaskResult)
	case *fabricv1.AgentMessage_ControllerReport:
		if s.deps.OnControllerReport != nil {
			s.deps.OnControllerReport(ctx, ss.nodeID, msg.ControllerReport)
		}
	case *fabricv1.AgentMessage_Hello:
		// Only the first message may be a Hello; a repeated one is ignored.
	}
}

// recordTaskResult hands a result to its recorder and, once that says it is recorded
// (committed, or refused for good), acknowledges it to the agent, which then forgets it.
// A result not recorded (the database unavailable) is not acknowledged: the agent keeps
// it on disk and sends it again. A result that was recorded but whose acknowledgement
// was lost comes again and is acknowledged again (recording is idempotent by task id).
func (s *Server) recordTaskResult(ctx context.Context, ss *session, r *fabricv1.TaskResult) {
	if s.deps.OnTaskResult == nil {
		return
	}
	if err := s.deps.OnTaskResult(ctx, ss.nodeID, r); err != nil {
		s.deps.Log.Warn("fabric: task result not recorded; the agent will send it again", "node_id", ss.nodeID, "task_id", r.GetTaskId(), "err", err)
		return
	}
	ack := &fabricv1.ControlMessage{Msg: &fabricv1.ControlMessage_ResultAck{ResultAck: &fabricv1.TaskResultAck{TaskId: r.GetTaskId()}}}
	if err := ss.send(ctx, ack); err != nil {
		// The tunnel ended: the agent sends the result again on its next one.
		s.deps.Log.Debug("fabric: result acknowledgement not sent", "node_id", ss.nodeID, "task_id", r.GetTaskId(), "err", err)
	}
}

func fleetInventory(version, host string, inv *fabricv1.Inventory) fleet.Inventory {
	out := fleet.Inventory{AgentVersion: version, Hostname: host}
	for _, g := range inv.GetGpus() {
		out.GPUs = append(out.GPUs, fleet.GPU{
			Index: int(g.GetIndex()), UUID: g.GetUuid(), Model: g.GetModel(), MemoryBytes: g.GetMemoryBytes(),
			PCIBusID: g.GetPciBusId(), MIGEnabled: g.GetMigMode() == fabricv1.MIGMode_MIG_MODE_ENABLED,
			DriverVersion: g.GetDriverVersion(), CUDAVersion: g.GetCudaVersion(),
		})
	}
	return out
}

func fleetMetrics(t *fabricv1.Telemetry) []fleet.GPUMetrics {
	out := make([]fleet.GPUMetrics, 0, len(t.GetGpus()))
	for _, g := range t.GetGpus() {
		out = append(out, fleet.GPUMetrics{
			UUID: g.GetUuid(), UtilizationPercent: g.GetUtilizationPercent(), MemoryUsedBytes: g.GetMemoryUsedBytes(),
			TemperatureC: g.GetTemperatureC(), PowerMilliwatts: g.GetPowerMilliwatts(),
			ECCErrorsCorrected: g.GetEccErrorsCorrected(), ECCErrorsUncorrect: g.GetEccErrorsUncorrected(),
			XIDErrors: g.GetXidErrors(), Healthy: g.GetHealthy(), SampledAt: g.GetSampledAt().AsTime(),
		})
	}
	return out
}
