package apps

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/gantry-gpu/gantry/nodeagent/runtime"
	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// record is what the agent keeps on disk per instance.
type record struct {
	InstanceID   string `json:"app_instance_id"`
	AllocationID string `json:"allocation_id"`
	// Spec is the app.start payload (protobuf).
	Spec         []byte    `json:"spec,omitempty"`
	Port         uint32    `json:"port"`
	PID          int       `json:"pid,omitempty"`
	State        string    `json:"state"`
	Reason       string    `json:"reason,omitempty"`
	Message      string    `json:"message,omitempty"`
	Generation   uint64    `json:"generation"`
	Restarts     uint32    `json:"restarts"`
	Failures     uint32    `json:"failures"` // exits since the process was last healthy
	EverHealthy  bool      `json:"ever_healthy"`
	ExitCode     *int32    `json:"exit_code,omitempty"`
	ExitAt       time.Time `json:"exit_at,omitzero"`
	StartedAt    time.Time `json:"started_at,omitzero"`
	HealthyAt    time.Time `json:"healthy_at,omitzero"`
	FirstStartAt time.Time `json:"first_start_at,omitzero"`
	ObservedAt   time.Time `json:"observed_at,omitzero"`
}

func (r record) spec() (*fabricv1.AppStartTask, error) {
	t := &fabricv1.AppStartTask{}
	if err := proto.Unmarshal(r.Spec, t); err != nil {
		return nil, err
	}
	return t, apptask.ValidateStart(t)
}

// instance is one supervised app instance.
type instance struct {
	s        *Supervisor
	spec     *fabricv1.AppStartTask
	done     chan struct{} // closed when supervision ended
	starting chan struct{} // closed when the first start returned (nil for restored)

	mu         sync.Mutex
	rec        record
	stopCh     chan struct{}
	stopReason string
	stopGrace  time.Duration
	tail       *tailBuffer
}

func (in *instance) allocationID() string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.rec.AllocationID
}

// requestStop ends supervision with reason ("stopped" or "allocation_inactive"); the
// first request wins.
func (in *instance) requestStop(reason string, grace time.Duration) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.stopCh == nil {
		in.stopCh = make(chan struct{})
	}
	if in.stopReason != "" {
		return
	}
	in.stopReason, in.stopGrace = reason, grace
	close(in.stopCh)
}

func (in *instance) stopChan() <-chan struct{} {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.stopCh == nil {
		in.stopCh = make(chan struct{})
	}
	return in.stopCh
}

// setState records a state; the generation moves only when state or reason changes.
// The record is written before the change is announced.
func (in *instance) setState(state, reason, message string) {
	in.update(func(r *record) {
		if len(message) > apptask.MaxMessageBytes {
			message = message[:apptask.MaxMessageBytes]
			for !utf8.ValidString(message) {
				message = message[:len(message)-1]
			}
		}
		r.Message = message
		if r.State != state || r.Reason != reason {
			r.State, r.Reason = state, reason
			r.Generation++
			r.ObservedAt = in.s.o.Clock.Now()
		}
	})
}

// update changes the record, writes it, and tells the agent when the generation moved.
func (in *instance) update(f func(r *record)) {
	in.mu.Lock()
	gen := in.rec.Generation
	f(&in.rec)
	r := in.rec
	in.mu.Unlock()
	if err := in.s.saveRecord(r); err != nil {
		in.s.o.Logger.Error("app instance record not saved", "app_instance_id", r.InstanceID, "err", err)
	}
	if r.Generation != gen {
		in.s.o.Logger.Info("app instance "+r.State, "app_instance_id", r.InstanceID, "allocation_id", r.AllocationID,
			"reason", r.Reason, "message", r.Message, "generation", r.Generation)
		in.s.notify()
	}
}

func (in *instance) report() *fabricv1.ControllerReport {
	in.mu.Lock()
	r := in.rec
	in.mu.Unlock()
	st := &fabricv1.AppInstanceStatus{
		AllocationId: r.AllocationID, Port: r.Port, Restarts: r.Restarts, LastExitAt: ts(r.ExitAt),
		StartedAt: ts(r.StartedAt), HealthyAt: ts(r.HealthyAt), Reason: r.Reason,
	}
	if r.ExitCode != nil {
		st.LastExitCode = *r.ExitCode
	}
	return &fabricv1.ControllerReport{
		Controller: apptask.Controller, ObjectId: r.InstanceID, State: r.State, Message: r.Message,
		Generation: r.Generation, ObservedAt: ts(r.ObservedAt), AppInstance: st,
	}
}

// first is the app.start of a new instance: checks, the first process, the record.
func (in *instance) first() (int, string, error) {
	s, spec := in.s, in.spec
	env, ok := s.o.Envs.Session(spec.GetAllocationId())
	if !ok {
		return 0, apptask.CodeAllocationNotActive, fmt.Errorf("allocation %s is not active on this node", spec.GetAllocationId())
	}
	if n := len(gpuUUIDs(env.Env)); n < int(spec.GetMinGpus()) {
		return 0, apptask.CodeInsufficientGPUs, fmt.Errorf("the app needs %d GPU(s); allocation %s has %d", spec.GetMinGpus(), spec.GetAllocationId(), n)
	}
	port := int(spec.GetPort())
	if port == 0 {
		p, err := freePort()
		if err != nil {
			return 0, apptask.CodeStartFailed, fmt.Errorf("no free port: %w", err)
		}
		port = p
	}
	raw, err := apptask.Encode(spec)
	if err != nil {
		return 0, apptask.CodeInvalidPayload, err
	}
	now := s.o.Clock.Now()
	in.mu.Lock()
	in.rec = record{InstanceID: spec.GetAppInstanceId(), AllocationID: spec.GetAllocationId(), Spec: raw, Port: uint32(port), FirstStartAt: now}
	in.mu.Unlock()
	if err := in.artifacts(env); err != nil {
		var ae *artifactError
		code := apptask.CodeStartFailed
		if errors.As(err, &ae) {
			code = ae.code
		}
		reason := apptask.ReasonStartFailed
		if code == apptask.CodeArtifactDigestMismatch || code == apptask.CodeArtifactUnavailable {
			reason = code
		}
		in.setState(apptask.StateFailed, reason, err.Error())
		close(in.done)
		return port, code, err
	}
	p, err := in.spawn(env)
	if err != nil {
		in.setState(apptask.StateFailed, apptask.ReasonStartFailed, err.Error())
		close(in.done)
		return port, apptask.CodeStartFailed, err
	}
	in.update(func(r *record) { r.PID, r.StartedAt = p.pid, now })
	in.setState(apptask.StateStarting, "", "")
	s.wg.Add(1)
	go in.superviseProc(s.ctx, p)
	return port, "", nil
}

// artifacts places the instance's artifacts (placeArtifacts) before its first process.
func (in *instance) artifacts(env runtime.SessionEnv) error {
	if len(in.spec.GetArtifacts()) == 0 {
		return nil
	}
	dir, err := in.dir(env)
	if err != nil {
		return err
	}
	// Bounded: with no tunnel the fetch would wait for one forever.
	ctx, cancel := context.WithTimeout(in.s.ctx, ArtifactTimeout)
	defer cancel()
	return placeArtifacts(ctx, in.s.o.Artifacts, in.spec, dir)
}

// ArtifactTimeout bounds fetching an instance's artifacts (artifact_unavailable past it).
const ArtifactTimeout = 30 * time.Minute

// supervise resumes a restored instance: adopts its process when alive, else treats it
// as exited.
func (in *instance) supervise(ctx context.Context, pid int) {
	if _, live := in.s.o.Envs.Session(in.rec.AllocationID); !live {
		// The allocation stopped or was released while no agent watched.
		defer in.s.wg.Done()
		defer close(in.done)
		if pid > 0 && alive(in.s.o.ProcDir, pid, in.rec.InstanceID) {
			_ = terminate(adopt(in.s.o.ProcDir, pid, in.rec.InstanceID), apptask.DefaultStopGrace)
		}
		in.update(func(r *record) { r.PID = 0 })
		in.setState(apptask.StateStopped, apptask.ReasonAllocationInactive, "the allocation is no longer active on this node")
		return
	}
	if pid > 0 && alive(in.s.o.ProcDir, pid, in.rec.InstanceID) {
		in.s.o.Logger.Info("app instance process adopted", "app_instance_id", in.rec.InstanceID, "pid", pid)
		in.superviseProc(ctx, adopt(in.s.o.ProcDir, pid, in.rec.InstanceID))
		return
	}
	in.superviseProc(ctx, nil)
}

type outcome int

const (
	outShutdown outcome = iota
	outStop
	outNeverHealthy
	outExited
)

// superviseProc watches p (nil: the process is gone, restart it) until the instance is
// stopped or failed, or ctx ends (the process is then left running).
func (in *instance) superviseProc(ctx context.Context, p *proc) {
	defer in.s.wg.Done()
	defer close(in.done)
	spec := in.spec
	maxRestarts := spec.GetMaxRestarts()
	if maxRestarts == 0 {
		maxRestarts = apptask.DefaultMaxRestarts
	}
	for {
		if p != nil {
			switch in.watch(ctx, p) {
			case outShutdown:
				return
			case outStop:
				in.mu.Lock()
				reason, grace := in.stopReason, in.stopGrace
				in.mu.Unlock()
				err := terminate(p, grace)
				msg := ""
				if err != nil {
					msg = err.Error()
				}
				in.exited(p)
				in.setState(apptask.StateStopped, reason, msg)
				return
			case outNeverHealthy:
				_ = terminate(p, time.Second)
				in.exited(p)
				in.setState(apptask.StateFailed, apptask.ReasonNeverHealthy,
					fmt.Sprintf("not healthy within %s of its start%s", startupTimeout(spec), in.tailMessage()))
				return
			case outExited:
				in.exited(p)
			}
		}
		in.mu.Lock()
		in.rec.Failures++
		failures, healthy := in.rec.Failures, in.rec.EverHealthy
		code := int32(-1)
		if in.rec.ExitCode != nil {
			code = *in.rec.ExitCode
		}
		in.mu.Unlock()
		if failures > maxRestarts {
			in.setState(apptask.StateFailed, apptask.ReasonCrashLoop,
				fmt.Sprintf("exited %d times in a row without becoming healthy (last exit code %d)%s", failures, code, in.tailMessage()))
			return
		}
		delay := backoff(spec, failures)
		state := apptask.StateStarting
		if healthy {
			state = apptask.StateUnhealthy
		}
		in.setState(state, "", fmt.Sprintf("process exited with code %d; restart %d in %s", code, failures, delay))
		if !in.wait(ctx, delay) {
			return
		}
		env, ok := in.s.o.Envs.Session(in.rec.AllocationID)
		if !ok {
			in.setState(apptask.StateStopped, apptask.ReasonAllocationInactive, "the allocation is no longer active on this node")
			return
		}
		np, err := in.spawn(env)
		if err != nil {
			in.setState(apptask.StateFailed, apptask.ReasonStartFailed, err.Error())
			return
		}
		now := in.s.o.Clock.Now()
		in.update(func(r *record) { r.PID, r.StartedAt, r.Restarts = np.pid, now, r.Restarts+1 })
		p = np
	}
}

// wait sleeps delay before a restart; false when supervision ended meanwhile (shutdown,
// stop, or the startup time ran out; the state is then recorded).
func (in *instance) wait(ctx context.Context, delay time.Duration) bool {
	t := time.NewTimer(delay)
	defer t.Stop()
	var deadline <-chan time.Time
	if dt := in.neverHealthyTimer(); dt != nil {
		defer dt.Stop()
		deadline = dt.C
	}
	select {
	case <-ctx.Done():
		return false
	case <-in.stopChan():
		in.mu.Lock()
		reason := in.stopReason
		in.mu.Unlock()
		in.setState(apptask.StateStopped, reason, "")
		return false
	case <-deadline:
		in.setState(apptask.StateFailed, apptask.ReasonNeverHealthy,
			fmt.Sprintf("not healthy within %s of its start%s", startupTimeout(in.spec), in.tailMessage()))
		return false
	case <-t.C:
		return true
	}
}

// exited records p's exit.
func (in *instance) exited(p *proc) {
	select {
	case <-p.exited:
	default:
		return
	}
	code := p.code
	now := in.s.o.Clock.Now()
	in.update(func(r *record) { r.ExitCode, r.ExitAt, r.PID = &code, now, 0 })
}

func (in *instance) tailMessage() string {
	if in.tail == nil {
		return ""
	}
	if t := in.tail.String(); t != "" {
		return "; output ends: " + t
	}
	return ""
}

func startupTimeout(spec *fabricv1.AppStartTask) time.Duration {
	if d := spec.GetStartupTimeout().AsDuration(); d > 0 {
		return d
	}
	return apptask.DefaultStartupTimeout
}

// neverHealthyTimer fires when an instance that was never healthy runs out of startup
// time; nil once it has been healthy.
func (in *instance) neverHealthyTimer() *time.Timer {
	in.mu.Lock()
	healthy, first := in.rec.EverHealthy, in.rec.FirstStartAt
	in.mu.Unlock()
	if healthy {
		return nil
	}
	left := time.Until(first.Add(startupTimeout(in.spec)))
	return time.NewTimer(max(left, 0))
}

func backoff(spec *fabricv1.AppStartTask, n uint32) time.Duration {
	lo, hi := spec.GetBackoffMin().AsDuration(), spec.GetBackoffMax().AsDuration()
	if lo <= 0 {
		lo = apptask.DefaultBackoffMin
	}
	if hi <= 0 {
		hi = apptask.DefaultBackoffMax
	}
	if hi < lo {
		hi = lo
	}
	d := lo
	for i := uint32(1); i < n && d < hi; i++ {
		d *= 2
	}
	return min(d, hi)
}

// watch health-checks p until it exits, the instance is stopped, it runs out of startup
// time, or ctx ends.
func (in *instance) watch(ctx context.Context, p *proc) outcome {
	hc := newChecker(in.spec)
	tick := time.NewTicker(hc.interval)
	defer tick.Stop()
	var deadline <-chan time.Time
	if dt := in.neverHealthyTimer(); dt != nil {
		defer dt.Stop()
		deadline = dt.C
	}
	stop := in.stopChan()
	fails := 0
	for {
		select {
		case <-ctx.Done():
			return outShutdown
		case <-stop:
			return outStop
		case <-p.exited:
			return outExited
		case <-deadline:
			return outNeverHealthy
		case <-tick.C:
		}
		in.mu.Lock()
		port, state := int(in.rec.Port), in.rec.State
		in.mu.Unlock()
		err := hc.check(ctx, port)
		if err == nil {
			fails = 0
			if state != apptask.StateRunning {
				deadline = nil
				now := in.s.o.Clock.Now()
				in.update(func(r *record) { r.EverHealthy, r.HealthyAt, r.Failures = true, now, 0 })
				in.setState(apptask.StateRunning, "", "")
			}
			continue
		}
		fails++
		if state == apptask.StateRunning && fails >= hc.threshold {
			in.setState(apptask.StateUnhealthy, "", fmt.Sprintf("health check failed %d times in a row: %v", fails, err))
		}
	}
}

// terminate ends p's process group: SIGTERM, SIGKILL after grace, and waits (bounded)
// for the process to be gone.
func terminate(p *proc, grace time.Duration) error {
	groupAlive := func() bool { return syscall.Kill(-p.pid, 0) == nil }
	signal := func(sig syscall.Signal) {
		if err := syscall.Kill(-p.pid, sig); errors.Is(err, syscall.ESRCH) {
			_ = syscall.Kill(p.pid, sig)
		}
	}
	gone := func() bool {
		select {
		case <-p.exited:
			return !groupAlive()
		default:
			return false
		}
	}
	if grace > 0 {
		signal(syscall.SIGTERM)
		deadline := time.Now().Add(grace)
		for time.Now().Before(deadline) {
			if gone() {
				return nil
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for range 250 { // about 5 s
		signal(syscall.SIGKILL)
		if gone() {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("process group %d still alive after SIGKILL", p.pid)
}
