package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

var (
	// ErrNodeOffline: no replica holds a live tunnel to the node (the API's node_offline).
	ErrNodeOffline = errors.New("fabric: node offline")
	// ErrDispatchTimeout: the agent did not acknowledge the task in time. It may still
	// execute it: redeliver with the same task id (the agent answers DUPLICATE).
	ErrDispatchTimeout = errors.New("fabric: task not acknowledged in time")
)

// NotHeldHereError is OpenStream's error when another replica holds the node's tunnel:
// the caller must reach the node through that replica.
type NotHeldHereError struct{ Replica string }

func (e *NotHeldHereError) Error() string {
	return "fabric: node's tunnel is held by replica " + e.Replica
}

func (s *Server) dispatchSubject(replica string) string {
	return s.cfg.SubjectPrefix + "replica." + replica + ".dispatch"
}

func (s *Server) disconnectSubject() string { return s.cfg.SubjectPrefix + "disconnect" }

type disconnectMsg struct {
	NodeID uuid.UUID `json:"node_id"`
	Reason string    `json:"reason"`
}

// subscribe joins the replica subjects: disconnect (every replica) and this replica's
// dispatch inbox.
func (s *Server) subscribe() error {
	sub, err := s.deps.NATS.Subscribe(s.disconnectSubject(), func(m *nats.Msg) {
		var d disconnectMsg
		if json.Unmarshal(m.Data, &d) != nil {
			return
		}
		if ss := s.local(d.NodeID); ss != nil {
			ss.close(endDisconnected, d.Reason)
		}
		if m.Reply != "" {
			_ = m.Respond(nil)
		}
	})
	if err != nil {
		return fmt.Errorf("fabric: subscribe: %w", err)
	}
	s.subs = append(s.subs, sub)
	sub, err = s.deps.NATS.Subscribe(s.dispatchSubject(s.cfg.ReplicaID), s.serveForwarded)
	if err != nil {
		return fmt.Errorf("fabric: subscribe: %w", err)
	}
	s.subs = append(s.subs, sub)
	return s.deps.NATS.Flush()
}

// Disconnect ends the node's tunnel on whichever replica holds it, at once, and marks
// the node offline (fleet.Disconnector). Call it after the change that causes it
// (token revoked, node deleted) has committed: the agent's reconnect must already be
// refused.
func (s *Server) Disconnect(ctx context.Context, nodeID uuid.UUID, reason string) error {
	if ss := s.local(nodeID); ss != nil {
		ss.close(endDisconnected, reason)
	}
	b, _ := json.Marshal(disconnectMsg{NodeID: nodeID, Reason: reason})
	if err := s.deps.NATS.Publish(s.disconnectSubject(), b); err != nil {
		return fmt.Errorf("fabric: disconnect: %w", err)
	}
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.deps.NATS.FlushWithContext(fctx); err != nil {
		return fmt.Errorf("fabric: disconnect: %w", err)
	}
	// A holder that is gone cannot mark it: do it here (compare-and-set, so at most one
	// replica does).
	if e, ok := s.presence.get(nodeID); ok && e.Online && !s.replicaAlive(e.Replica) {
		s.markOffline(ctx, nodeID, uuid.Nil)
	}
	return nil
}

// Dispatch sends task to the node's agent and returns the agent's acknowledgement
// (ACCEPTED, DUPLICATE or REJECTED), wherever the node's tunnel is: on this replica
// directly, on another replica by NATS request/reply to the holder. ErrNodeOffline when
// no replica holds a live tunnel; ErrDispatchTimeout when the agent did not answer in
// time (ctx's deadline, else DispatchTimeout).
func (s *Server) Dispatch(ctx context.Context, nodeID uuid.UUID, task *fabricv1.TaskDispatch) (*fabricv1.TaskAck, error) {
	if task.GetTaskId() == "" || task.GetKind() == "" {
		return nil, errors.New("fabric: task needs an id and a kind")
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.DispatchTimeout)
		defer cancel()
	}
	if ss := s.local(nodeID); ss != nil {
		return s.dispatchLocal(ctx, ss, task)
	}
	e, ok := s.presence.get(nodeID)
	if !ok || !e.Online || e.Replica == s.cfg.ReplicaID || !s.replicaAlive(e.Replica) {
		return nil, ErrNodeOffline
	}
	req, _ := proto.Marshal(&fabricv1.ForwardedDispatch{NodeId: nodeID.String(), Task: task})
	msg, err := s.deps.NATS.RequestWithContext(ctx, s.dispatchSubject(e.Replica), req)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, ErrNodeOffline
		}
		if ctx.Err() != nil {
			return nil, ErrDispatchTimeout
		}
		return nil, fmt.Errorf("fabric: forward dispatch: %w", err)
	}
	var rep fabricv1.ForwardedDispatchReply
	if err := proto.Unmarshal(msg.Data, &rep); err != nil {
		return nil, fmt.Errorf("fabric: forward dispatch reply: %w", err)
	}
	switch rep.GetErrorCode() {
	case "":
		return rep.GetAck(), nil
	case "node_offline":
		return nil, ErrNodeOffline
	case "timeout":
		return nil, ErrDispatchTimeout
	}
	return nil, fmt.Errorf("fabric: forward dispatch: %s: %s", rep.GetErrorCode(), rep.GetMessage())
}

func (s *Server) dispatchLocal(ctx context.Context, ss *session, task *fabricv1.TaskDispatch) (*fabricv1.TaskAck, error) {
	ch := make(chan *fabricv1.TaskAck, 1)
	ss.mu.Lock()
	if ss.closed || ss.ctl == nil {
		ss.mu.Unlock()
		return nil, ErrNodeOffline
	}
	ss.pending[task.GetTaskId()] = ch
	ss.mu.Unlock()
	defer func() {
		ss.mu.Lock()
		if ss.pending[task.GetTaskId()] == ch {
			delete(ss.pending, task.GetTaskId())
		}
		ss.mu.Unlock()
	}()
	if err := ss.send(ctx, &fabricv1.ControlMessage{Msg: &fabricv1.ControlMessage_Task{Task: task}}); err != nil {
		if ctx.Err() != nil {
			return nil, ErrDispatchTimeout
		}
		return nil, ErrNodeOffline
	}
	select {
	case ack, ok := <-ch:
		if !ok {
			return nil, ErrNodeOffline
		}
		return ack, nil
	case <-ctx.Done():
		return nil, ErrDispatchTimeout
	}
}

// serveForwarded dispatches a task another replica forwarded to this one.
func (s *Server) serveForwarded(m *nats.Msg) {
	reply := func(r *fabricv1.ForwardedDispatchReply) {
		b, _ := proto.Marshal(r)
		_ = m.Respond(b)
	}
	var req fabricv1.ForwardedDispatch
	if err := proto.Unmarshal(m.Data, &req); err != nil {
		reply(&fabricv1.ForwardedDispatchReply{ErrorCode: "invalid", Message: "bad request"})
		return
	}
	nodeID, err := uuid.Parse(req.GetNodeId())
	if err != nil {
		reply(&fabricv1.ForwardedDispatchReply{ErrorCode: "invalid", Message: "bad node id"})
		return
	}
	ss := s.local(nodeID)
	if ss == nil {
		reply(&fabricv1.ForwardedDispatchReply{ErrorCode: "node_offline"})
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.DispatchTimeout)
		defer cancel()
		ack, err := s.dispatchLocal(ctx, ss, req.GetTask())
		switch {
		case err == nil:
			reply(&fabricv1.ForwardedDispatchReply{Ack: ack})
		case errors.Is(err, ErrDispatchTimeout):
			reply(&fabricv1.ForwardedDispatchReply{ErrorCode: "timeout"})
		default:
			reply(&fabricv1.ForwardedDispatchReply{ErrorCode: "node_offline"})
		}
	}()
}

// OpenStream opens a raw stream (terminal, app proxy) to the node's agent and returns
// it once the agent accepted the preamble. Only the replica holding the tunnel can:
// elsewhere it returns *NotHeldHereError naming the holder, and ErrNodeOffline when
// nobody holds it. An agent's refusal is a *fabricnet.StreamRefusedError.
func (s *Server) OpenStream(ctx context.Context, nodeID uuid.UUID, pre *fabricv1.StreamPreamble) (net.Conn, error) {
	if ss := s.local(nodeID); ss != nil {
		c, err := fabricnet.OpenRaw(ctx, ss.fs, pre)
		if err != nil {
			var refused *fabricnet.StreamRefusedError
			if errors.As(err, &refused) || ctx.Err() != nil {
				return nil, err
			}
			select {
			case <-ss.done:
				return nil, ErrNodeOffline
			default:
			}
			return nil, err
		}
		return c, nil
	}
	if e, ok := s.presence.get(nodeID); ok && e.Online && e.Replica != s.cfg.ReplicaID && s.replicaAlive(e.Replica) {
		return nil, &NotHeldHereError{Replica: e.Replica}
	}
	return nil, ErrNodeOffline
}
