// Package tasks is the agent's side of task dispatch: the control plane sends a task (an
// id, a kind, an opaque payload) down the tunnel; the agent runs it through an Executor
// and acknowledges the result. The allocations issue fills in the executors (prepare a
// GPU, start a workload, tear it down); this package owns only the contract and the
// at-most-once guarantee per task id.
//
// Delivery is at least once (the control plane redelivers until it sees an ack, and the
// tunnel can drop between run and ack), so Once remembers results by task id and hands
// a redelivered task the remembered result instead of running it again.
package tasks

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
)

// Task is one unit of work sent by the control plane.
type Task struct {
	ID          string // unique per task, stable across redeliveries
	Kind        string // e.g. "allocation.provision"; the executor routes on it
	Payload     []byte // kind-specific
	ContentType string // "application/json" (default) or "application/protobuf"
	Attempt     uint32 // delivery attempt, from 1
}

// Status is how a task ended.
type Status string

const (
	Succeeded Status = "succeeded"
	Failed    Status = "failed"
)

// Result is what the agent acknowledges.
type Result struct {
	Status Status
	Output []byte // kind-specific
	// ErrorCode is a short stable code when Status is Failed (e.g. "unsupported_kind",
	// "invalid_payload", "gpu_unavailable"); ErrorMessage is for operators.
	ErrorCode    string
	ErrorMessage string
}

// Fail builds a failed Result.
func Fail(code string, err error) Result {
	return Result{Status: Failed, ErrorCode: code, ErrorMessage: err.Error()}
}

// Executor runs tasks. Execute must honour ctx (cancelled on agent shutdown) and return
// a Result for every task: an error inside the task is a Failed result, not a panic.
type Executor interface {
	Execute(ctx context.Context, t Task) Result
}

// ExecutorFunc adapts a function to Executor.
type ExecutorFunc func(ctx context.Context, t Task) Result

func (f ExecutorFunc) Execute(ctx context.Context, t Task) Result { return f(ctx, t) }

// Error codes this package produces.
const (
	CodeUnsupportedKind = "unsupported_kind"
	CodeCancelled       = "cancelled"
	CodePanic           = "executor_panic"
)

// Mux routes tasks to an Executor per kind. A kind nobody registered fails with
// CodeUnsupportedKind, so an agent older than the control plane says so instead of
// hanging the task.
type Mux struct {
	mu    sync.RWMutex
	kinds map[string]Executor
}

// NewMux returns an empty Mux.
func NewMux() *Mux { return &Mux{kinds: map[string]Executor{}} }

// Handle registers e for kind, replacing any earlier registration.
func (m *Mux) Handle(kind string, e Executor) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.kinds[kind] = e
}

// Kinds lists the registered kinds, sorted (the agent advertises them on hello).
func (m *Mux) Kinds() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]string, 0, len(m.kinds))
	for k := range m.kinds {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Supports reports whether kind is registered; the agent rejects a dispatch of an
// unsupported kind in its ack instead of accepting and failing it.
func (m *Mux) Supports(kind string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	_, ok := m.kinds[kind]
	return ok
}

// Execute implements Executor.
func (m *Mux) Execute(ctx context.Context, t Task) Result {
	m.mu.RLock()
	e, ok := m.kinds[t.Kind]
	m.mu.RUnlock()
	if !ok {
		return Fail(CodeUnsupportedKind, fmt.Errorf("task kind %q is not supported by this agent", t.Kind))
	}
	return e.Execute(ctx, t)
}

// DefaultRemember is how many finished task ids Once keeps by default. Redelivery
// happens within seconds of a reconnect, so a few thousand is generous.
const DefaultRemember = 4096

// Once runs each task id at most once: a redelivery while the first run is still going
// waits for it, and a redelivery after it finished gets the remembered Result. The
// memory of finished ids is bounded (oldest forgotten first).
//
// A task whose run was cancelled (ctx ended, i.e. the agent is shutting down) is not
// remembered, so a redelivery after restart runs it again — executors must therefore
// be safe to re-run after an interrupted attempt, which is the usual idempotency
// requirement for work that touches the host.
type Once struct {
	next     Executor
	remember int

	mu       sync.Mutex
	running  map[string]*call
	done     map[string]Result
	order    []string // finished ids, oldest first (ring via head)
	head     int
	executed int // how many times next.Execute was called (for tests and metrics)
}

type call struct {
	wait chan struct{}
	res  Result
	ok   bool // false when cancelled: waiters must run it themselves
}

// NewOnce wraps next. remember <= 0 means DefaultRemember.
func NewOnce(next Executor, remember int) *Once {
	if remember <= 0 {
		remember = DefaultRemember
	}
	return &Once{next: next, remember: remember, running: map[string]*call{}, done: map[string]Result{}}
}

// Execute implements Executor.
func (o *Once) Execute(ctx context.Context, t Task) Result {
	for {
		o.mu.Lock()
		if r, ok := o.done[t.ID]; ok {
			o.mu.Unlock()
			return r
		}
		if c, ok := o.running[t.ID]; ok {
			o.mu.Unlock()
			select {
			case <-c.wait:
				if c.ok {
					return c.res
				}
				continue // the first run was cancelled; try to run it ourselves
			case <-ctx.Done():
				return Fail(CodeCancelled, ctx.Err())
			}
		}
		c := &call{wait: make(chan struct{})}
		o.running[t.ID] = c
		o.executed++
		o.mu.Unlock()

		c.res = o.run(ctx, t)
		c.ok = ctx.Err() == nil

		o.mu.Lock()
		delete(o.running, t.ID)
		if c.ok {
			o.rememberLocked(t.ID, c.res)
		}
		o.mu.Unlock()
		close(c.wait)
		return c.res
	}
}

// Go starts t in a new goroutine unless its id is already running or finished, and
// reports whether it did. done receives the Result, and whether it counts (false when
// ctx ended during the run: the result is not remembered and should not be reported).
// Unlike Execute, the id is registered before Go returns, so a redelivery that arrives
// a moment later is recognised as a duplicate.
func (o *Once) Go(ctx context.Context, t Task, done func(Result, bool)) bool {
	o.mu.Lock()
	if _, ok := o.done[t.ID]; ok {
		o.mu.Unlock()
		return false
	}
	if _, ok := o.running[t.ID]; ok {
		o.mu.Unlock()
		return false
	}
	c := &call{wait: make(chan struct{})}
	o.running[t.ID] = c
	o.executed++
	o.mu.Unlock()
	go func() {
		c.res = o.run(ctx, t)
		c.ok = ctx.Err() == nil
		o.mu.Lock()
		delete(o.running, t.ID)
		if c.ok {
			o.rememberLocked(t.ID, c.res)
		}
		o.mu.Unlock()
		close(c.wait)
		done(c.res, c.ok)
	}()
	return true
}

func (o *Once) run(ctx context.Context, t Task) (res Result) {
	defer func() {
		if p := recover(); p != nil {
			res = Fail(CodePanic, fmt.Errorf("executor panicked: %v", p))
		}
	}()
	return o.next.Execute(ctx, t)
}

func (o *Once) rememberLocked(id string, r Result) {
	if len(o.order) < o.remember {
		o.order = append(o.order, id)
	} else {
		delete(o.done, o.order[o.head])
		o.order[o.head] = id
		o.head = (o.head + 1) % o.remember
	}
	o.done[id] = r
}

// Executions is how many times the wrapped executor has been called.
func (o *Once) Executions() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.executed
}

// ErrEmptyID is returned by Validate for a task without an id.
var ErrEmptyID = errors.New("tasks: task id is empty")

// Validate checks what Once relies on.
func (t Task) Validate() error {
	if t.ID == "" {
		return ErrEmptyID
	}
	return nil
}

// State is what Once knows about a task id.
type State int

const (
	Unknown  State = iota // never seen, or forgotten
	Running               // executing now
	Finished              // finished; Lookup returns its Result
)

// Lookup says whether id is running or finished (with its Result), without running it.
func (o *Once) Lookup(id string) (State, Result) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if r, ok := o.done[id]; ok {
		return Finished, r
	}
	if _, ok := o.running[id]; ok {
		return Running, Result{}
	}
	return Unknown, Result{}
}

// Active lists the ids running now, sorted.
func (o *Once) Active() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]string, 0, len(o.running))
	for id := range o.running {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}
