package runtime

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/gantry-gpu/gantry/nodeagent/tasks"
	"github.com/gantry-gpu/gantry/shared/alloctask"
)

// maxPayloadBytes bounds a task payload: 32 keys of 16 KiB and 16 GPUs fit well inside.
const maxPayloadBytes = 1 << 20

// Execute implements tasks.Executor for the four allocation kinds: it decodes the JSON
// alloctask.Payload, runs the runtime operation and returns a Result whose Output is the
// JSON alloctask.ProvisionResult for provision and restart (empty for stop and release).
// Failures carry alloctask error codes; a cancelled run (agent shutdown) carries
// tasks.CodeCancelled, which tasks.Once does not remember, so the redelivery runs it.
func (r *Runtime) Execute(ctx context.Context, t tasks.Task) tasks.Result {
	if t.ContentType != "" && t.ContentType != alloctask.ContentType {
		return tasks.Fail(alloctask.CodeInvalidPayload, fmt.Errorf("content type %q, want %s", t.ContentType, alloctask.ContentType))
	}
	if len(t.Payload) > maxPayloadBytes {
		return tasks.Fail(alloctask.CodeInvalidPayload, fmt.Errorf("payload of %d bytes, at most %d", len(t.Payload), maxPayloadBytes))
	}
	var p alloctask.Payload
	if err := json.Unmarshal(t.Payload, &p); err != nil {
		return tasks.Fail(alloctask.CodeInvalidPayload, fmt.Errorf("payload is not an allocation task: %w", err))
	}
	var (
		res    alloctask.ProvisionResult
		output bool
		err    error
	)
	switch t.Kind {
	case alloctask.KindProvision:
		res, err = r.Provision(ctx, p)
		output = true
	case alloctask.KindRestart:
		res, err = r.Restart(ctx, p)
		output = true
	case alloctask.KindStop:
		err = r.Stop(ctx, p)
	case alloctask.KindRelease:
		err = r.Release(ctx, p)
	default:
		return tasks.Fail(tasks.CodeUnsupportedKind, fmt.Errorf("task kind %q is not an allocation task", t.Kind))
	}
	if err != nil {
		if ctx.Err() != nil {
			return tasks.Fail(tasks.CodeCancelled, err)
		}
		return tasks.Fail(Code(err), err)
	}
	out := tasks.Result{Status: tasks.Succeeded}
	if output {
		if out.Output, err = json.Marshal(res); err != nil {
			return tasks.Fail(alloctask.CodeRuntimeFailed, err)
		}
	}
	return out
}

// Register routes the allocation task kinds of m to r.
func (r *Runtime) Register(m *tasks.Mux) {
	for _, k := range alloctask.Kinds {
		m.Handle(k, r)
	}
}

// Mux returns a tasks.Mux with the allocation kinds routed to r; the agent advertises
// them and rejects other kinds at dispatch.
func (r *Runtime) Mux() *tasks.Mux {
	m := tasks.NewMux()
	r.Register(m)
	return m
}
