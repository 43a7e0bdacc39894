package lifecycle

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

// State is an app instance's state.
type State string

// Every state, in lifecycle order.
const (
	Requested State = "requested" // waiting for its allocation, or for the node to take the app.start task
	Starting  State = "starting"  // the node took app.start; the process was not healthy since it (re)started
	Running   State = "running"   // the health check passes
	Unhealthy State = "unhealthy" // it passed once, and now fails (or the process restarts with backoff)
	Stopping  State = "stopping"  // the stop task is out
	Stopped   State = "stopped"   // final: stopped on request, or its allocation ended
	Failed    State = "failed"    // final: never healthy in time, crash-looped, or the agent gave up
)

// States lists every state, in the order the documented table uses.
var States = []State{Requested, Starting, Running, Unhealthy, Stopping, Stopped, Failed}

// Event is what happens to an instance.
type Event string

// Events. Reports are the node agent's controller reports for the instance; commands
// come from a user (stop) or from the control plane's reconcile pass.
const (
	// Reports (controller "app_instance", the state the agent observed).
	ReportedStarting  Event = "reported_starting"  // the supervisor (re)started the process; not healthy yet
	ReportedRunning   Event = "reported_running"   // the health check passes
	ReportedUnhealthy Event = "reported_unhealthy" // the health check fails, or the process is restarting with backoff
	ReportedStopped   Event = "reported_stopped"   // no process, and the supervisor is not restarting it
	ReportedFailed    Event = "reported_failed"    // the supervisor gave up (command missing, restart budget spent)

	// Commands.
	Start           Event = "start"            // the allocation is active: the start task is enqueued
	HealthTimeout   Event = "health_timeout"   // not healthy for longer than the health timeout
	Stop            Event = "stop"             // DELETE /api/v1/app-instances/{id}
	AllocationEnded Event = "allocation_ended" // its allocation left the states that run workloads
)

// Events lists every event, in the order the documented table uses.
var Events = []Event{
	ReportedStarting, ReportedRunning, ReportedUnhealthy, ReportedStopped, ReportedFailed,
	Start, HealthTimeout, Stop, AllocationEnded,
}

// IsReport reports whether e is an observation of the node agent rather than a command.
func (e Event) IsReport() bool {
	switch e {
	case ReportedStarting, ReportedRunning, ReportedUnhealthy, ReportedStopped, ReportedFailed:
		return true
	}
	return false
}

// transitions is the one table of allowed moves: event -> from -> to.
var transitions = map[Event]map[State]State{
	// A restarted agent (or a restarted process) starts over: running and unhealthy go
	// back to starting until the health check passes again.
	ReportedStarting: {Requested: Starting, Running: Starting, Unhealthy: Starting},
	// A lost "starting" report must not strand an instance the agent reports healthy.
	ReportedRunning: {Requested: Running, Starting: Running, Unhealthy: Running},
	// Unhealthy means "was healthy, is not": before the first pass it is still starting.
	ReportedUnhealthy: {Requested: Starting, Running: Unhealthy},
	// The process is gone while it should run, and nobody restarts it: failed. Asked to
	// stop, it is what was asked.
	ReportedStopped: {Starting: Failed, Running: Failed, Unhealthy: Failed, Stopping: Stopped},
	ReportedFailed:  {Requested: Failed, Starting: Failed, Running: Failed, Unhealthy: Failed, Stopping: Stopped},
	Start:           {Requested: Starting},
	HealthTimeout:   {Starting: Failed, Unhealthy: Failed},
	// The node has not taken anything for a requested instance: it stops at once (a
	// start task in flight is followed by an app.stop).
	Stop: {Requested: Stopped, Starting: Stopping, Running: Stopping, Unhealthy: Stopping},
	AllocationEnded: {
		Requested: Stopped, Starting: Stopped, Running: Stopped, Unhealthy: Stopped, Stopping: Stopped,
	},
}

// repeats are the (event, state) pairs that change nothing and write nothing: a report
// the agent sends again (telemetry), a health report about an instance that is being
// stopped, the node taking a start task of an instance it already reports on.
var repeats = map[Event]map[State]bool{
	ReportedStarting:  {Starting: true, Stopping: true},
	ReportedRunning:   {Running: true, Stopping: true},
	ReportedUnhealthy: {Starting: true, Unhealthy: true, Stopping: true},
	ReportedStopped:   {Stopped: true, Failed: true},
	ReportedFailed:    {Failed: true, Stopped: true},
	Start:             {Starting: true, Running: true, Unhealthy: true},
	AllocationEnded:   {Stopped: true, Failed: true},
}

// IsFinal reports whether s has no way out: stopped or failed.
func IsFinal(s State) bool { return s == Stopped || s == Failed }

// IsLive reports whether s counts against the project's instance quota and holds a port
// on its node.
func IsLive(s State) bool { return !IsFinal(s) }

// Outcome is the result of an allowed move.
type Outcome struct {
	From, To State
	Event    Event
	// Changed is false for a repeat: nothing is written, nothing is audited.
	Changed bool
}

// ErrForbidden is wrapped by every refused move.
var ErrForbidden = errors.New("lifecycle: move not allowed")

// ErrUnknown is wrapped for a state or event outside the table (a bug, or a corrupt row).
var ErrUnknown = errors.New("lifecycle: unknown state or event")

func known(s State, e Event) bool {
	okS, okE := false, false
	for _, x := range States {
		okS = okS || x == s
	}
	for _, x := range Events {
		okE = okE || x == e
	}
	return okS && okE
}

// Apply is the move event e makes from state from: an Outcome, or the contract error of
// a forbidden move (wrapping ErrForbidden).
func Apply(from State, e Event) (Outcome, error) {
	if !known(from, e) {
		return Outcome{From: from, To: from, Event: e}, fmt.Errorf("%w: %q on %q", ErrUnknown, e, from)
	}
	if to, ok := transitions[e][from]; ok {
		return Outcome{From: from, To: to, Event: e, Changed: true}, nil
	}
	if repeats[e][from] {
		return Outcome{From: from, To: from, Event: e}, nil
	}
	return Outcome{From: from, To: from, Event: e}, refusal(from, e)
}

// refusal is the error of a forbidden move: a command on an instance in the wrong state
// is app_instance_state_invalid (409); a report that does not fit (late, out of order) is
// 409 invalid_request with details.reason app_instance_transition_invalid, which the
// report path logs and drops.
func refusal(from State, e Event) *apierr.Error {
	var err *apierr.Error
	if e.IsReport() {
		err = apierr.New(apierr.InvalidRequest, "%s does not apply to a %s app instance", e, from).
			WithStatus(409).With("reason", "app_instance_transition_invalid")
	} else {
		err = apierr.New(apierr.AppInstanceStateInvalid, "cannot %s a %s app instance", strings.ReplaceAll(string(e), "_", " "), from)
		if IsFinal(from) {
			err.With("reason", "final_state")
		} else {
			err.With("reason", "state_not_eligible")
		}
	}
	return err.With("from", string(from)).With("event", string(e)).Wrap(ErrForbidden)
}

// FromReport maps a controller report's state name to its event ("" when unknown).
func FromReport(state string) Event {
	switch State(state) {
	case Starting:
		return ReportedStarting
	case Running:
		return ReportedRunning
	case Unhealthy:
		return ReportedUnhealthy
	case Stopped:
		return ReportedStopped
	case Failed:
		return ReportedFailed
	}
	return ""
}
