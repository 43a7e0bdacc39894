package apps

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gantry-gpu/gantry/nodeagent/runtime"
	"github.com/gantry-gpu/gantry/nodeagent/tasks"
	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/clock"
)

// EnvInstanceID tags every process of an app instance (with the allocation's
// GANTRY_ALLOCATION_ID), so a restarted agent recognises the process it adopts.
const EnvInstanceID = "GANTRY_APP_INSTANCE_ID"

// DefaultTerminalTTL is how long stopped and failed instances are still reported.
const DefaultTerminalTTL = time.Hour

// DefaultReportInterval is how often every instance's report is sent again on a tunnel
// that stays up (a heartbeat for the control plane; not a change).
const DefaultReportInterval = 60 * time.Second

// Environments answers which allocations are live on this node and how to start a
// process in them (*runtime.Runtime).
type Environments interface {
	Session(allocationID string) (runtime.SessionEnv, bool)
}

// Options configure a Supervisor. Envs is required.
type Options struct {
	Envs Environments
	// StateDir keeps the instance records (<StateDir>/apps); "" keeps them in memory
	// only (no adoption after a restart).
	StateDir string
	// TerminalTTL (default DefaultTerminalTTL) and ReportInterval (default
	// DefaultReportInterval).
	TerminalTTL    time.Duration
	ReportInterval time.Duration
	// ProcDir is /proc (tests may not change it; it exists for symmetry with runtime).
	ProcDir string
	// Artifacts reads the files of instances' artifacts from the control plane
	// (FabricArtifacts over the agent's tunnel); nil refuses a start that has any.
	Artifacts ArtifactSource
	Clock     clock.Clock
	Logger    *slog.Logger
}

// Supervisor runs the app instances of one node. Register its task kinds, give the
// agent its reports and streams, and call Restore once before the agent connects.
type Supervisor struct {
	o   Options
	ctx context.Context // the supervisor's lifetime (Restore's)

	mu      sync.Mutex
	inst    map[string]*instance
	changed chan struct{}
	wg      sync.WaitGroup
}

// New returns a Supervisor.
func New(o Options) (*Supervisor, error) {
	if o.Envs == nil {
		return nil, errors.New("apps: Envs is required")
	}
	if o.TerminalTTL <= 0 {
		o.TerminalTTL = DefaultTerminalTTL
	}
	if o.ReportInterval <= 0 {
		o.ReportInterval = DefaultReportInterval
	}
	if o.ProcDir == "" {
		o.ProcDir = "/proc"
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.StateDir != "" {
		if err := os.MkdirAll(filepath.Join(o.StateDir, "apps"), 0o700); err != nil {
			return nil, fmt.Errorf("apps: state directory: %w", err)
		}
	}
	return &Supervisor{o: o, ctx: context.Background(), inst: map[string]*instance{}, changed: make(chan struct{}, 1)}, nil
}

// Register adds app.start, app.stop and app.bootstrap_ssh to the agent's task mux.
func (s *Supervisor) Register(mux *tasks.Mux) {
	mux.Handle(apptask.KindStart, tasks.ExecutorFunc(s.executeStart))
	mux.Handle(apptask.KindStop, tasks.ExecutorFunc(s.executeStop))
	mux.Handle(apptask.KindBootstrapSSH, tasks.ExecutorFunc(s.executeBootstrapSSH))
}

// Restore loads the records a previous agent left and resumes supervising every live
// instance (adopting its process when still alive). ctx is the supervisor's lifetime:
// when it ends, supervision ends and processes are left running for the next agent.
func (s *Supervisor) Restore(ctx context.Context) error {
	s.ctx = ctx
	recs, err := s.loadRecords()
	if err != nil {
		return err
	}
	for _, r := range recs {
		in := &instance{s: s, rec: r, done: make(chan struct{})}
		s.mu.Lock()
		s.inst[r.InstanceID] = in
		s.mu.Unlock()
		if apptask.Terminal(r.State) {
			close(in.done)
			continue
		}
		spec, err := r.spec()
		if err != nil {
			in.setState(apptask.StateFailed, apptask.ReasonStartFailed, "the record's spec is unreadable: "+err.Error())
			close(in.done)
			continue
		}
		in.spec = spec
		s.wg.Add(1)
		go in.supervise(ctx, r.PID)
	}
	if len(recs) > 0 {
		s.o.Logger.Info("app instances restored", "instances", len(recs))
	}
	return nil
}

// Wait blocks until every supervising goroutine has returned (after Restore's ctx ended).
func (s *Supervisor) Wait() { s.wg.Wait() }

// Changed is signalled when some instance's report changed.
func (s *Supervisor) Changed() <-chan struct{} { return s.changed }

// ReportInterval is how often the agent should resend every report.
func (s *Supervisor) ReportInterval() time.Duration { return s.o.ReportInterval }

func (s *Supervisor) notify() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// Reports returns the latest report of every instance, by instance id, and forgets
// terminal instances older than TerminalTTL.
func (s *Supervisor) Reports() []*fabricv1.ControllerReport {
	now := s.o.Clock.Now()
	s.mu.Lock()
	ins := make([]*instance, 0, len(s.inst))
	for id, in := range s.inst {
		in.mu.Lock()
		expired := apptask.Terminal(in.rec.State) && now.Sub(in.rec.ObservedAt) > s.o.TerminalTTL
		in.mu.Unlock()
		if expired {
			delete(s.inst, id)
			s.removeRecord(id)
			continue
		}
		ins = append(ins, in)
	}
	s.mu.Unlock()
	out := make([]*fabricv1.ControllerReport, 0, len(ins))
	for _, in := range ins {
		out = append(out, in.report())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetObjectId() < out[j].GetObjectId() })
	return out
}

// Instance is a snapshot of one instance, for tests and the CLI.
type Instance struct {
	ID, AllocationID, State, Reason, Message string
	Port                                     int
	PID                                      int
	Restarts                                 int
	Generation                               uint64
}

// Instances lists every known instance, by id.
func (s *Supervisor) Instances() []Instance {
	s.mu.Lock()
	ins := make([]*instance, 0, len(s.inst))
	for _, in := range s.inst {
		ins = append(ins, in)
	}
	s.mu.Unlock()
	out := make([]Instance, 0, len(ins))
	for _, in := range ins {
		in.mu.Lock()
		r := in.rec
		in.mu.Unlock()
		out = append(out, Instance{ID: r.InstanceID, AllocationID: r.AllocationID, State: r.State, Reason: r.Reason,
			Message: r.Message, Port: int(r.Port), PID: r.PID, Restarts: int(r.Restarts), Generation: r.Generation})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Get returns one instance's snapshot.
func (s *Supervisor) Get(id string) (Instance, bool) {
	for _, in := range s.Instances() {
		if in.ID == id {
			return in, true
		}
	}
	return Instance{}, false
}

// EndAllocation is the runtime's OnInactive: the allocation stops or is released here,
// and the runtime kills its processes next, so the allocation's instances become
// "stopped" (allocation_inactive) instead of being restarted.
func (s *Supervisor) EndAllocation(allocationID string) {
	s.mu.Lock()
	var ins []*instance
	for _, in := range s.inst {
		if in.allocationID() == allocationID {
			ins = append(ins, in)
		}
	}
	s.mu.Unlock()
	for _, in := range ins {
		in.requestStop(apptask.ReasonAllocationInactive, apptask.DefaultStopGrace)
	}
}

func (s *Supervisor) executeStart(ctx context.Context, t tasks.Task) tasks.Result {
	if t.ContentType != apptask.ContentType {
		return tasks.Fail(apptask.CodeInvalidPayload, fmt.Errorf("content type %q, want %s", t.ContentType, apptask.ContentType))
	}
	spec, err := apptask.DecodeStart(t.Payload)
	if err != nil {
		return tasks.Fail(apptask.CodeInvalidPayload, err)
	}
	port, code, err := s.Start(spec)
	if err != nil {
		return tasks.Fail(code, err)
	}
	out, err := apptask.Encode(&fabricv1.AppStartResult{Port: uint32(port)})
	if err != nil {
		return tasks.Fail(apptask.CodeStartFailed, err)
	}
	return tasks.Result{Status: tasks.Succeeded, Output: out}
}

func (s *Supervisor) executeStop(ctx context.Context, t tasks.Task) tasks.Result {
	if t.ContentType != apptask.ContentType {
		return tasks.Fail(apptask.CodeInvalidPayload, fmt.Errorf("content type %q, want %s", t.ContentType, apptask.ContentType))
	}
	spec, err := apptask.DecodeStop(t.Payload)
	if err != nil {
		return tasks.Fail(apptask.CodeInvalidPayload, err)
	}
	grace := spec.GetGrace().AsDuration()
	if spec.GetGrace() == nil {
		grace = apptask.DefaultStopGrace
	}
	if err := s.Stop(ctx, spec.GetAppInstanceId(), spec.GetAllocationId(), grace); err != nil {
		return tasks.Fail(apptask.CodeStopFailed, err)
	}
	return tasks.Result{Status: tasks.Succeeded}
}

// startError carries a task error code.
type startError struct {
	code string
	err  error
}

// Start starts supervising an instance and returns its port; for a failure, the task
// error code and the error. Starting an instance already supervised answers its port.
func (s *Supervisor) Start(spec *fabricv1.AppStartTask) (int, string, error) {
	id := spec.GetAppInstanceId()
	s.mu.Lock()
	if in, ok := s.inst[id]; ok {
		s.mu.Unlock()
		if in.starting != nil {
			<-in.starting // a concurrent start of the same instance: answer as it did
			s.mu.Lock()
			again, still := s.inst[id]
			s.mu.Unlock()
			if !still || again != in {
				return s.Start(spec) // it was refused and forgotten: try afresh
			}
		}
		in.mu.Lock()
		r := in.rec
		in.mu.Unlock()
		switch {
		case r.AllocationID != spec.GetAllocationId():
			return 0, apptask.CodeAllocationMismatch, fmt.Errorf("app instance %s runs in allocation %s, not %s", id, r.AllocationID, spec.GetAllocationId())
		case apptask.Terminal(r.State):
			return 0, apptask.CodeInstanceTerminal, fmt.Errorf("app instance %s is %s here (%s); a new instance needs a new id", id, r.State, r.Reason)
		}
		return int(r.Port), "", nil
	}
	// Reserve the id while starting, so a concurrent duplicate waits for this one.
	in := &instance{s: s, spec: spec, done: make(chan struct{}), starting: make(chan struct{})}
	s.inst[id] = in
	s.mu.Unlock()
	port, code, err := in.first()
	close(in.starting)
	if err != nil && code != apptask.CodeStartFailed && code != apptask.CodeArtifactDigestMismatch && code != apptask.CodeArtifactUnavailable {
		// Nothing was started or recorded: forget the reservation.
		close(in.done)
		s.mu.Lock()
		delete(s.inst, id)
		s.mu.Unlock()
	}
	return port, code, err
}

// Stop stops an instance and waits until its process is gone (or ctx ends). An unknown
// instance is recorded as stopped (unknown_instance) so the control plane converges.
func (s *Supervisor) Stop(ctx context.Context, id, allocationID string, grace time.Duration) error {
	s.mu.Lock()
	in, ok := s.inst[id]
	if !ok {
		in = &instance{s: s, done: make(chan struct{}), rec: record{InstanceID: id, AllocationID: allocationID}}
		close(in.done)
		s.inst[id] = in
	}
	s.mu.Unlock()
	if !ok {
		in.setState(apptask.StateStopped, apptask.ReasonUnknownInstance, "this node does not know the instance")
		return nil
	}
	if in.starting != nil {
		<-in.starting
	}
	in.requestStop(apptask.ReasonStopped, grace)
	select {
	case <-in.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	in.mu.Lock()
	st := in.rec.State
	in.mu.Unlock()
	if !apptask.Terminal(st) {
		// Supervision ended without a stop (the agent is shutting down).
		return errors.New("the agent is shutting down; the stop is redelivered")
	}
	return nil
}

// Target is where an app proxy stream for the instance connects, and whether the
// instance is live on this node.
func (s *Supervisor) target(id string) (port int, allocationID, state string, ok bool) {
	s.mu.Lock()
	in, found := s.inst[id]
	s.mu.Unlock()
	if !found {
		return 0, "", "", false
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return int(in.rec.Port), in.rec.AllocationID, in.rec.State, true
}

// freePort asks the kernel for an unused loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// gpuUUIDs lists the allocation's GPUs from its environment (CUDA_VISIBLE_DEVICES).
func gpuUUIDs(env []string) []string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, runtime.EnvCUDAVisible+"="); ok {
			if v == "" {
				return nil
			}
			return strings.Split(v, ",")
		}
	}
	return nil
}

func gpuIndices(n int) string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = strconv.Itoa(i)
	}
	return strings.Join(ids, ",")
}

func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}
