package agent

import (
	"context"
	"sort"

	"github.com/gantry-gpu/gantry/nodeagent/tasks"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// Ack error codes (TaskAck.error_code when REJECTED).
const (
	AckInvalidTask      = "invalid_task"
	AckDeadlineExceeded = "deadline_exceeded"
	AckUnsupportedKind  = tasks.CodeUnsupportedKind
)

// supporter is implemented by executors that know their kinds up front (tasks.Mux).
type supporter interface{ Supports(kind string) bool }

// dispatch decides the ack for one TaskDispatch and starts the task when it is new.
// Tasks run under the agent's lifetime context, not the tunnel's: a tunnel that drops
// mid-task does not cancel the work, and the result is reported on the next tunnel.
func (a *Agent) dispatch(ctx context.Context, d *fabricv1.TaskDispatch) *fabricv1.TaskAck {
	id := d.GetTaskId()
	ack := &fabricv1.TaskAck{TaskId: id}
	reject := func(code, msg string) *fabricv1.TaskAck {
		ack.Status, ack.ErrorCode, ack.Message = fabricv1.TaskAckStatus_TASK_ACK_STATUS_REJECTED, code, msg
		a.log.Warn("task rejected", "task_id", id, "kind", d.GetKind(), "code", code)
		return ack
	}
	if id == "" || len(id) > 128 || d.GetKind() == "" {
		return reject(AckInvalidTask, "task id and kind are required")
	}
	switch state, res := a.once.Lookup(id); state {
	case tasks.Running:
		ack.Status = fabricv1.TaskAckStatus_TASK_ACK_STATUS_DUPLICATE
		return ack
	case tasks.Finished:
		ack.Status = fabricv1.TaskAckStatus_TASK_ACK_STATUS_DUPLICATE
		a.addResult(id, res)
		return ack
	}
	if dl := d.GetDeadline(); dl != nil && a.o.Clock.Now().After(dl.AsTime()) {
		return reject(AckDeadlineExceeded, "the task's deadline passed before it could start")
	}
	if s, ok := a.o.Executor.(supporter); ok && !s.Supports(d.GetKind()) {
		return reject(AckUnsupportedKind, "this agent has no executor for kind "+d.GetKind())
	}
	t := tasks.Task{ID: id, Kind: d.GetKind(), Payload: d.GetPayload(), ContentType: d.GetContentType(), Attempt: d.GetAttempt()}
	a.tasksWG.Add(1)
	started := a.once.Go(ctx, t, func(r tasks.Result, counts bool) {
		defer a.tasksWG.Done()
		if counts {
			a.addResult(id, r)
		}
		a.log.Info("task finished", "task_id", id, "kind", t.Kind, "status", r.Status, "error_code", r.ErrorCode)
	})
	if !started {
		a.tasksWG.Done()
		ack.Status = fabricv1.TaskAckStatus_TASK_ACK_STATUS_DUPLICATE
		return ack
	}
	a.log.Info("task accepted", "task_id", id, "kind", t.Kind, "attempt", t.Attempt)
	ack.Status = fabricv1.TaskAckStatus_TASK_ACK_STATUS_ACCEPTED
	return ack
}

// addResult queues a result for the control plane and wakes the tunnel's writer.
func (a *Agent) addResult(id string, r tasks.Result) {
	tr := &fabricv1.TaskResult{
		TaskId:     id,
		Status:     fabricv1.TaskResultStatus_TASK_RESULT_STATUS_SUCCEEDED,
		Result:     r.Output,
		ErrorCode:  r.ErrorCode,
		Message:    r.ErrorMessage,
		FinishedAt: ts(a.o.Clock.Now()),
	}
	if r.Status != tasks.Succeeded {
		tr.Status = fabricv1.TaskResultStatus_TASK_RESULT_STATUS_FAILED
	}
	a.mu.Lock()
	if _, ok := a.unreported[id]; ok || len(a.unreported) < maxUnreported {
		a.unreported[id] = tr
	}
	a.mu.Unlock()
	select {
	case a.notify <- struct{}{}:
	default:
	}
}

// flushResults sends every unreported result, oldest id first; a result leaves the
// queue once sent. One lost with the tunnel is asked for again by a redelivery, which
// gets DUPLICATE and the remembered result.
func (a *Agent) flushResults(send func(*fabricv1.AgentMessage) error) error {
	a.mu.Lock()
	ids := make([]string, 0, len(a.unreported))
	for id := range a.unreported {
		ids = append(ids, id)
	}
	a.mu.Unlock()
	sort.Strings(ids)
	for _, id := range ids {
		a.mu.Lock()
		tr, ok := a.unreported[id]
		a.mu.Unlock()
		if !ok {
			continue
		}
		if err := send(&fabricv1.AgentMessage{Msg: &fabricv1.AgentMessage_TaskResult{TaskResult: tr}}); err != nil {
			return err
		}
		a.mu.Lock()
		if a.unreported[id] == tr {
			delete(a.unreported, id)
		}
		a.mu.Unlock()
	}
	return nil
}

// activeTaskIDs is what Hello reports: tasks running, and finished but unreported.
func (a *Agent) activeTaskIDs() []string {
	ids := a.once.Active()
	a.mu.Lock()
	for id := range a.unreported {
		ids = append(ids, id)
	}
	a.mu.Unlock()
	sort.Strings(ids)
	return ids
}
