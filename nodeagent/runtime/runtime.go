package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/gantry-gpu/gantry/nodeagent/gpu"
	"github.com/gantry-gpu/gantry/shared/alloctask"
	"github.com/gantry-gpu/gantry/shared/clock"
)

// Inventory is the part of gpu.Backend the runtime reads: which GPUs this host has.
type Inventory interface {
	Inventory(ctx context.Context) (gpu.Inventory, error)
}

// Defaults.
const (
	DefaultSSHPort   = 22
	DefaultStopGrace = 10 * time.Second
	// TombstoneTTL is how long the record of a released allocation is kept (a late
	// provision is refused for that long); older tombstones are removed when the
	// runtime opens.
	TombstoneTTL = 30 * 24 * time.Hour
)

// Options configure a Runtime. Driver, StateDir and Inventory are required.
type Options struct {
	Driver Driver
	// StateDir holds the records (<StateDir>/allocations/<id>.json).
	StateDir  string
	Inventory Inventory
	// AdvertiseHost and SSHPort are the connection details a provision returns (the
	// host users reach with SSH). AdvertiseHost is required; SSHPort defaults to 22.
	AdvertiseHost string
	SSHPort       int
	// StopGrace is how long stop waits after SIGTERM before SIGKILL (default 10 s).
	StopGrace time.Duration
	// OnInactive, when set, is told that an allocation stopped or is being released,
	// after its new phase is saved and before its processes are killed: the terminal
	// server ends the allocation's sessions with "allocation_released" instead of
	// letting the kill report a signal.
	OnInactive func(allocationID string, kind string)
	Clock      clock.Clock
	Logger     *slog.Logger
}

// Runtime runs allocation tasks on this host through its Driver. Safe for concurrent
// use: operations on one allocation are serialised, different allocations run in
// parallel.
type Runtime struct {
	o     Options
	store store
	locks keyedMutex

	mu      sync.RWMutex
	records map[string]*record // every record on disk, by allocation id
}

// New opens the state directory, loads the records (removing tombstones older than
// TombstoneTTL) and returns the Runtime.
func New(o Options) (*Runtime, error) {
	if o.Driver == nil || o.StateDir == "" || o.Inventory == nil || o.AdvertiseHost == "" {
		return nil, errors.New("runtime: Driver, StateDir, Inventory and AdvertiseHost are required")
	}
	if o.SSHPort == 0 {
		o.SSHPort = DefaultSSHPort
	}
	if o.SSHPort < 1 || o.SSHPort > 65535 {
		return nil, fmt.Errorf("runtime: ssh port %d out of range", o.SSHPort)
	}
	if o.StopGrace <= 0 {
		o.StopGrace = DefaultStopGrace
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Runtime{o: o, store: store{dir: filepath.Join(o.StateDir, "allocations")}, records: map[string]*record{}}
	if err := r.store.init(); err != nil {
		return nil, fmt.Errorf("runtime: state directory: %w", err)
	}
	recs, err := r.store.all()
	if err != nil {
		return nil, err
	}
	now := o.Clock.Now()
	for _, rec := range recs {
		if rec.Phase == PhaseReleased && now.Sub(rec.UpdatedAt) > TombstoneTTL {
			if err := r.store.remove(rec.AllocationID); err != nil {
				return nil, err
			}
			continue
		}
		r.records[rec.AllocationID] = rec
	}
	return r, nil
}

// Name is the driver's name ("process", "linux-user").
func (r *Runtime) Name() string { return r.o.Driver.Name() }

// Phase returns the allocation's phase on this node (PhaseNone when unknown).
func (r *Runtime) Phase(allocationID string) Phase {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if rec, ok := r.records[allocationID]; ok {
		return rec.Phase
	}
	return PhaseNone
}

// Provision makes the allocation exist and returns how its user reaches it.
func (r *Runtime) Provision(ctx context.Context, p alloctask.Payload) (alloctask.ProvisionResult, error) {
	return r.apply(ctx, alloctask.KindProvision, p)
}

// NotifyInactive sets Options.OnInactive on a Runtime already built (the terminal
// server that wants the notice needs the Runtime first). Call it before tasks run.
func (r *Runtime) NotifyInactive(f func(allocationID, kind string)) { r.o.OnInactive = f }

// Restart ends the allocation's processes, lets it run again and re-applies its keys and
// environment (from p). An allocation this node does not know is provisioned.
func (r *Runtime) Restart(ctx context.Context, p alloctask.Payload) (alloctask.ProvisionResult, error) {
	return r.apply(ctx, alloctask.KindRestart, p)
}

// Stop makes sure nothing of the allocation runs and no session can start (billing
// stopped it); restart and release remain possible.
func (r *Runtime) Stop(ctx context.Context, p alloctask.Payload) error {
	_, err := r.apply(ctx, alloctask.KindStop, p)
	return err
}

// Release removes the allocation from the host. Releasing an allocation this node never
// saw, or one already released, succeeds.
func (r *Runtime) Release(ctx context.Context, p alloctask.Payload) error {
	_, err := r.apply(ctx, alloctask.KindRelease, p)
	return err
}

// apply runs one task kind: validate, look up the transition, do the host work, record.
func (r *Runtime) apply(ctx context.Context, kind string, p alloctask.Payload) (alloctask.ProvisionResult, error) {
	if err := validate(p); err != nil {
		return alloctask.ProvisionResult{}, fail(alloctask.CodeInvalidPayload, err)
	}
	if err := ctx.Err(); err != nil {
		return alloctask.ProvisionResult{}, fail(alloctask.CodeRuntimeFailed, err)
	}
	spec := Spec{AllocationID: p.AllocationID, User: p.User, SSHPublicKeys: p.SSHPublicKeys}
	unlock := r.locks.lock(p.AllocationID)
	defer unlock()

	prev := r.record(p.AllocationID)
	from := PhaseNone
	if prev != nil {
		from = prev.Phase
		if prev.Runtime != r.Name() {
			return alloctask.ProvisionResult{}, fail(alloctask.CodeRuntimeFailed,
				fmt.Errorf("allocation %s was set up by the %s runtime, this agent runs %s", p.AllocationID, prev.Runtime, r.Name()))
		}
	}
	st, err := next(from, kind)
	if err != nil {
		return alloctask.ProvisionResult{}, fail(alloctask.CodeRuntimeFailed, err)
	}
	log := r.o.Logger.With("allocation_id", p.AllocationID, "kind", kind, "runtime", r.Name(), "from", string(from))

	switch st.act {
	case actRefuse:
		return alloctask.ProvisionResult{}, fail(alloctask.CodeNotFound,
			fmt.Errorf("allocation %s was released on this node and is never set up again", p.AllocationID))
	case actNothing:
		log.Info("allocation task: nothing to do")
		return r.result(p.User), nil
	case actProvision, actRestart:
		gpus, err := r.resolveGPUs(ctx, p.GPUs)
		if err != nil {
			return alloctask.ProvisionResult{}, err
		}
		spec.GPUs = gpus
		if st.act == actRestart {
			if err := r.o.Driver.Kill(ctx, spec, r.o.StopGrace); err != nil {
				return alloctask.ProvisionResult{}, fail(alloctask.CodeRuntimeFailed, err)
			}
		}
		fresh := prev == nil || prev.Phase == PhaseProvisioning
		if fresh {
			// The intent goes to disk before the host changes, so a crash half-way
			// leaves a record that a release finds.
			if err := r.save(&record{AllocationID: p.AllocationID, Runtime: r.Name(), Phase: PhaseProvisioning, User: p.User, GPUs: p.GPUs}); err != nil {
				return alloctask.ProvisionResult{}, fail(alloctask.CodeRuntimeFailed, err)
			}
		}
		acct, err := r.o.Driver.Provision(ctx, spec)
		if err != nil {
			log.Error("allocation provision failed", "err", err)
			r.undo(ctx, spec, prev, fresh, log)
			return alloctask.ProvisionResult{}, fail(alloctask.CodeRuntimeFailed, err)
		}
		if err := r.save(&record{AllocationID: p.AllocationID, Runtime: r.Name(), Phase: st.then, User: p.User, GPUs: p.GPUs, Account: &acct}); err != nil {
			return alloctask.ProvisionResult{}, fail(alloctask.CodeRuntimeFailed, err)
		}
		log.Info("allocation provisioned", "user", acct.User, "gpus", len(spec.GPUs), "keys", len(spec.SSHPublicKeys))
		return r.result(p.User), nil
	case actStop, actRelease:
		// The new phase goes to disk first: Session stops answering at once, and an
		// agent that crashes half-way still knows the allocation must not run.
		rec := &record{AllocationID: p.AllocationID, Runtime: r.Name(), Phase: st.then, User: p.User, GPUs: p.GPUs}
		if prev != nil {
			rec.GPUs, rec.Account = prev.GPUs, prev.Account
		}
		if err := r.save(rec); err != nil {
			return alloctask.ProvisionResult{}, fail(alloctask.CodeRuntimeFailed, err)
		}
		if r.o.OnInactive != nil {
			r.o.OnInactive(p.AllocationID, kind)
		}
		if st.act == actStop {
			err = r.stop(ctx, spec)
		} else {
			err = r.o.Driver.Release(ctx, spec)
		}
		if err != nil {
			log.Error("allocation task failed", "err", err)
			return alloctask.ProvisionResult{}, fail(alloctask.CodeRuntimeFailed, err)
		}
		log.Info("allocation " + string(st.then))
		return alloctask.ProvisionResult{}, nil
	}
	return alloctask.ProvisionResult{}, fail(alloctask.CodeRuntimeFailed, fmt.Errorf("runtime: unknown action %d", st.act))
}

// stop locks first, then kills: a login that slipped in between would otherwise survive.
func (r *Runtime) stop(ctx context.Context, spec Spec) error {
	if err := r.o.Driver.Lock(ctx, spec); err != nil {
		return err
	}
	return r.o.Driver.Kill(ctx, spec, r.o.StopGrace)
}

// undo cleans up after a failed provision. A first provision is rolled back entirely
// (the control plane fails the allocation and may never send a release); its record
// goes even when the rollback fails, because a later release works from the payload
// alone. A provision or restart of an allocation that already existed keeps its record;
// a failed restart of a stopped allocation locks it again, since it must not run unpaid.
func (r *Runtime) undo(ctx context.Context, spec Spec, prev *record, fresh bool, log *slog.Logger) {
	ctx = context.WithoutCancel(ctx)
	switch {
	case fresh:
		if err := r.o.Driver.Release(ctx, spec); err != nil {
			log.Error("rolling back a failed provision", "err", err)
		}
		r.mu.Lock()
		delete(r.records, spec.AllocationID)
		r.mu.Unlock()
		if err := r.store.remove(spec.AllocationID); err != nil {
			log.Error("removing the record of a rolled-back provision", "err", err)
		}
	case prev.Phase == PhaseStopped:
		if err := r.stop(ctx, spec); err != nil {
			log.Error("locking a stopped allocation again after a failed restart", "err", err)
		}
	}
}

func (r *Runtime) result(user string) alloctask.ProvisionResult {
	return alloctask.ProvisionResult{Host: r.o.AdvertiseHost, Port: r.o.SSHPort, User: user}
}

func (r *Runtime) record(id string) *record {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.records[id]
}

func (r *Runtime) save(rec *record) error {
	rec.UpdatedAt = r.o.Clock.Now().UTC()
	if err := r.store.save(rec); err != nil {
		return err
	}
	r.mu.Lock()
	r.records[rec.AllocationID] = rec
	r.mu.Unlock()
	return nil
}

// validate checks a payload beyond alloctask's own rules: the user name must be the one
// derived from the allocation id (never an arbitrary account such as root), and no GPU
// may be listed twice.
func validate(p alloctask.Payload) error {
	if err := p.Validate(); err != nil {
		return err
	}
	if want := alloctask.UserName(p.AllocationID); p.User != want {
		return fmt.Errorf("user %q is not the allocation's runtime user %q", p.User, want)
	}
	seenUUID, seenIndex := map[string]bool{}, map[int]bool{}
	for _, g := range p.GPUs {
		if seenUUID[g.UUID] || seenIndex[g.Index] {
			return fmt.Errorf("gpu %q (index %d) listed twice", g.UUID, g.Index)
		}
		seenUUID[g.UUID], seenIndex[g.Index] = true, true
	}
	return nil
}

// resolveGPUs checks every requested GPU against this host's inventory (same UUID at
// the same index) and returns the inventory entries in index order.
func (r *Runtime) resolveGPUs(ctx context.Context, want []alloctask.GPU) ([]gpu.GPU, error) {
	inv, err := r.o.Inventory.Inventory(ctx)
	if err != nil {
		return nil, fail(alloctask.CodeRuntimeFailed, fmt.Errorf("reading the GPU inventory: %w", err))
	}
	byUUID := make(map[string]gpu.GPU, len(inv.GPUs))
	for _, g := range inv.GPUs {
		byUUID[g.UUID] = g
	}
	out := make([]gpu.GPU, 0, len(want))
	for _, w := range want {
		g, ok := byUUID[w.UUID]
		if !ok {
			return nil, fail(alloctask.CodeGPUUnavailable, fmt.Errorf("gpu %s is not on this host", w.UUID))
		}
		if g.Index != w.Index {
			return nil, fail(alloctask.CodeGPUUnavailable, fmt.Errorf("gpu %s is index %d on this host, not %d", w.UUID, g.Index, w.Index))
		}
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b gpu.GPU) int { return a.Index - b.Index })
	return out, nil
}

// keyedMutex serialises work per allocation id.
type keyedMutex struct {
	mu sync.Mutex
	m  map[string]*keyedEntry
}

type keyedEntry struct {
	mu   sync.Mutex
	refs int
}

func (k *keyedMutex) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyedEntry{}
	}
	e := k.m[key]
	if e == nil {
		e = &keyedEntry{}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}
