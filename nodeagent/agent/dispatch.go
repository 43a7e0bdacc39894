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
		kind := d.GetKind()
		if code != AckDeadlineExceeded {
			kind = "unsupported" // untrusted kind: keeps the metric's label set bounded
		}
		a.taskOutcome(kind, outcomeRejected)
		return ack
	}
	if id == "" || len(id) > 128 || d.GetKind() == "" {
		return reject(AckInvalidTask, "task id and kind are required")
	}
	// A result still waiting for its acknowledgement (reloaded from disk after a
	// restart, when tasks.Once no longer remembers the task): a duplicate, and the
	// result goes out again.
	a.mu.Lock()
	_, pending := a.unreported[id]
	if pending {
		delete(a.sent, id)
	}
	a.mu.Unlock()
	if pending {
		ack.Status = fabricv1.TaskAckStatus_TASK_ACK_STATUS_DUPLICATE
		return ack
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
			outcome := outcomeSucceeded
			if r.Status != tasks.Succeeded {
				outcome = outcomeFailed
			}
			a.taskOutcome(t.Kind, outcome)
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

// addResult keeps a result until the control plane acknowledges it — on disk first,
// then in memory — and wakes the tunnel's writer. A result that cannot be written to
// disk is still kept in memory (it is lost only if the agent also restarts).
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
	if err := a.results.save(tr); err != nil {
		a.log.Error("task result not saved to disk; kept in memory until acknowledged", "task_id", id, "err", err)
	}
	a.mu.Lock()
	a.unreported[id] = tr
	delete(a.sent, id)
	a.mu.Unlock()
	select {
	case a.notify <- struct{}{}:
	default:
	}
}

// flushResults sends every unacknowledged result not yet sent on this tunnel, by id.
// Sending does not forget a result: only the control plane's TaskResultAck does
// (acknowledged), after it committed it. A result written to a tunnel whose far end
// died before recording it is therefore sent again on the next tunnel (and every
// ResultResend on this one).
func (a *Agent) flushResults(send func(*fabricv1.AgentMessage) error) error {
	a.mu.Lock()
	ids := make([]string, 0, len(a.unreported))
	for id := range a.unreported {
		if !a.sent[id] {
			ids = append(ids, id)
		}
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
			a.sent[id] = true
		}
		a.mu.Unlock()
	}
	return nil
}

// acknowledged forgets a result the control plane has recorded: from disk first, so a
// crash in between leaves at most a result sent once more (which the control plane
// acknowledges again).
func (a *Agent) acknowledged(id string) {
	a.mu.Lock()
	_, ok := a.unreported[id]
	a.mu.Unlock()
	if !ok {
		return
	}
	if err := a.results.remove(id); err != nil {
		a.log.Error("acknowledged task result not removed from disk; it will be sent again", "task_id", id, "err", err)
		return
	}
	a.mu.Lock()
	delete(a.unreported, id)
	delete(a.sent, id)
	a.mu.Unlock()
	a.log.Debug("task result acknowledged", "task_id", id)
}

// activeTaskIDs is what Hello reports: tasks running, and finished but unacknowledged.
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
