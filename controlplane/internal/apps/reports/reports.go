// Package reports is the control plane's intake of the controller reports node agents
// send on their control stream (fabricv1.ControllerReport): it checks each report's
// shape and hands it to the service that owns its controller ("app_instance": the app
// instances service, apps/instances; "shared_runtime_worker" and others as they come).
// The fabric server calls OnControllerReport for every report (fabric.Deps), on the
// tunnel's receive loop, in order per node.
//
// Reports are not acknowledged: the agent sends every object's latest report on each
// new tunnel, when it changes and periodically, so a report that fails here (database
// unavailable) is superseded by the next one. Whether a report changes persisted state
// (and is audited) or only repeats it (telemetry) is the owning service's decision
// (seed §6.2 rule 1); this package never writes.
package reports

import (
	"context"
	"errors"
	"log/slog"
	"regexp"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// Applier takes the reports of one controller (apps/instances.Service implements it for
// "app_instance"). It returns an error for a report it could not apply; the report is
// then dropped (the agent's next report supersedes it).
type Applier interface {
	ApplyControllerReport(ctx context.Context, nodeID uuid.UUID, r *fabricv1.ControllerReport) error
}

// ApplierFunc adapts a function to Applier.
type ApplierFunc func(ctx context.Context, nodeID uuid.UUID, r *fabricv1.ControllerReport) error

// ApplyControllerReport calls f.
func (f ApplierFunc) ApplyControllerReport(ctx context.Context, nodeID uuid.UUID, r *fabricv1.ControllerReport) error {
	return f(ctx, nodeID, r)
}

// Limits on a report's fields; a report past them is dropped as invalid.
const (
	MaxStateBytes   = 64
	MaxDetailsBytes = 16 << 10
)

var controllerRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)

// Outcomes counted by Stats.
const (
	OutcomeApplied           = "applied"
	OutcomeInvalid           = "invalid"
	OutcomeUnknownController = "unknown_controller"
	OutcomeFailed            = "failed"
)

// Router dispatches reports by controller.
type Router struct {
	log *slog.Logger

	mu       sync.RWMutex
	appliers map[string]Applier

	applied, invalid, unknown, failed atomic.Uint64
}

// New returns a Router with no controllers.
func New(log *slog.Logger) *Router {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Router{log: log, appliers: map[string]Applier{}}
}

// Handle routes the reports of controller to a (replacing an earlier one).
func (r *Router) Handle(controller string, a Applier) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.appliers[controller] = a
}

// Stats is how many reports ended each way since the Router was made.
func (r *Router) Stats() map[string]uint64 {
	return map[string]uint64{
		OutcomeApplied: r.applied.Load(), OutcomeInvalid: r.invalid.Load(),
		OutcomeUnknownController: r.unknown.Load(), OutcomeFailed: r.failed.Load(),
	}
}

// ErrInvalid wraps Validate's errors.
var ErrInvalid = errors.New("invalid controller report")

// Validate checks a report's shape: a known-form controller name, a UUID object id, a
// bounded state, message and details, and for "app_instance" a state the agent
// reports (apptask.States) with its AppInstanceStatus.
func Validate(rep *fabricv1.ControllerReport) error {
	switch {
	case !controllerRE.MatchString(rep.GetController()):
		return errors.Join(ErrInvalid, errors.New("controller name"))
	case uuid.Validate(rep.GetObjectId()) != nil:
		return errors.Join(ErrInvalid, errors.New("object_id is not a UUID"))
	case rep.GetState() == "" || len(rep.GetState()) > MaxStateBytes || !utf8.ValidString(rep.GetState()):
		return errors.Join(ErrInvalid, errors.New("state"))
	case len(rep.GetMessage()) > apptask.MaxMessageBytes || !utf8.ValidString(rep.GetMessage()):
		return errors.Join(ErrInvalid, errors.New("message too long or not UTF-8"))
	case len(rep.GetDetailsJson()) > MaxDetailsBytes:
		return errors.Join(ErrInvalid, errors.New("details too long"))
	}
	if rep.GetController() == apptask.Controller {
		known := false
		for _, s := range apptask.States {
			known = known || s == rep.GetState()
		}
		if !known {
			return errors.Join(ErrInvalid, errors.New("unknown app instance state "+rep.GetState()))
		}
		st := rep.GetAppInstance()
		if st == nil {
			return errors.Join(ErrInvalid, errors.New("app_instance status missing"))
		}
		if id := st.GetAllocationId(); id != "" && uuid.Validate(id) != nil {
			return errors.Join(ErrInvalid, errors.New("app_instance.allocation_id is not a UUID"))
		}
		if st.GetPort() > 65535 || len(st.GetReason()) > 64 {
			return errors.Join(ErrInvalid, errors.New("app_instance port or reason"))
		}
	}
	return nil
}

// OnControllerReport is the fabric's report hook (fabric.Deps.OnControllerReport).
func (r *Router) OnControllerReport(ctx context.Context, nodeID uuid.UUID, rep *fabricv1.ControllerReport) {
	_ = r.Apply(ctx, nodeID, rep)
}

// Apply validates and routes one report and returns what became of it (nil when applied).
func (r *Router) Apply(ctx context.Context, nodeID uuid.UUID, rep *fabricv1.ControllerReport) error {
	log := r.log.With("node_id", nodeID, "controller", rep.GetController(), "object_id", rep.GetObjectId(), "state", rep.GetState(), "generation", rep.GetGeneration())
	if err := Validate(rep); err != nil {
		r.invalid.Add(1)
		log.Warn("controller report dropped: invalid", "err", err)
		return err
	}
	r.mu.RLock()
	a := r.appliers[rep.GetController()]
	r.mu.RUnlock()
	if a == nil {
		r.unknown.Add(1)
		log.Warn("controller report dropped: no service takes this controller's reports")
		return ErrUnknownController
	}
	if err := a.ApplyControllerReport(ctx, nodeID, rep); err != nil {
		r.failed.Add(1)
		log.Warn("controller report not applied; the agent's next report supersedes it", "err", err)
		return err
	}
	r.applied.Add(1)
	log.Debug("controller report applied")
	return nil
}

// ErrUnknownController is a report of a controller nobody registered.
var ErrUnknownController = errors.New("controller report of an unknown controller")
