package lifecycle

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Status is a workload status (seed §3, V3WorkloadStatus).
type Status string

// Every status of seed §3, in lifecycle order.
const (
	Requested     Status = "requested"
	Provisioning  Status = "provisioning"
	Active        Status = "active"
	Idle          Status = "idle"
	Stopped       Status = "stopped"
	Completed     Status = "completed"
	Restarting    Status = "restarting"
	RestartFailed Status = "restart_failed"
	Releasing     Status = "releasing"
	Released      Status = "released"
	Failed        Status = "failed"
	ReleaseFailed Status = "release_failed"
)

// Statuses lists every status, in the order the documented table uses.
var Statuses = []Status{
	Requested, Provisioning, Active, Idle, Stopped, Restarting, RestartFailed,
	Releasing, ReleaseFailed, Released, Failed, Completed,
}

// Event is what happens to an allocation.
type Event string

// Events. Reports come from the node agent (through the fabric) or the provisioning
// dispatcher; commands come from a user, an admin, billing or budgets.
const (
	// Reports.
	ProvisionStarted Event = "provision_started" // the agent acknowledged the task
	Provisioned      Event = "provisioned"       // the agent reports the workload up
	ProvisionFailed  Event = "provision_failed"  // agent failure, or the provisioning timeout
	WentIdle         Event = "went_idle"         // GPU utilization under the threshold long enough
	BecameBusy       Event = "became_busy"       // utilization back over the threshold
	RestartOK        Event = "restart_ok"
	RestartFailedEv  Event = "restart_failed"
	ReleaseOK        Event = "release_ok" // the agent cleaned up
	ReleaseFailedEv  Event = "release_failed"

	// Commands.
	Stop         Event = "stop" // budget suspend or runway exhaustion
	Restart      Event = "restart"
	Release      Event = "release"
	RetryRelease Event = "retry_release"
	ForceRelease Event = "force_release" // admin only; flags the node for cleanup
	Complete     Event = "complete"      // the workload finished by itself
)

// Events lists every event, in the order the documented table uses.
var Events = []Event{
	ProvisionStarted, Provisioned, ProvisionFailed, WentIdle, BecameBusy, RestartOK, RestartFailedEv,
	ReleaseOK, ReleaseFailedEv, Stop, Restart, Release, RetryRelease, ForceRelease, Complete,
}

// IsReport reports whether e is an observation (agent, dispatcher) rather than a command.
func (e Event) IsReport() bool {
	switch e {
	case ProvisionStarted, Provisioned, ProvisionFailed, WentIdle, BecameBusy, RestartOK, RestartFailedEv, ReleaseOK, ReleaseFailedEv:
		return true
	}
	return false
}

// transitions is the one table of allowed moves: event -> from -> to.
var transitions = map[Event]map[Status]Status{
	ProvisionStarted: {Requested: Provisioning},
	// A lost or coalesced "provisioning" report must not strand an allocation that the
	// agent reports up, so provisioned is accepted from requested as well.
	Provisioned:     {Requested: Active, Provisioning: Active},
	ProvisionFailed: {Requested: Failed, Provisioning: Failed},
	WentIdle:        {Active: Idle},
	BecameBusy:      {Idle: Active},
	RestartOK:       {Restarting: Active},
	RestartFailedEv: {Restarting: RestartFailed},
	ReleaseOK:       {Releasing: Released},
	ReleaseFailedEv: {Releasing: ReleaseFailed},
	Stop:            {Active: Stopped, Idle: Stopped, Restarting: Stopped, RestartFailed: Stopped},
	Restart:         {Active: Restarting, Idle: Restarting, Stopped: Restarting, RestartFailed: Restarting},
	Release: {
		Requested: Releasing, Provisioning: Releasing, Active: Releasing, Idle: Releasing, Stopped: Releasing,
		Restarting: Releasing, RestartFailed: Releasing,
		// POST .../release on a release_failed allocation is the retry action.
		ReleaseFailed: Releasing,
	},
	RetryRelease: {ReleaseFailed: Releasing},
	ForceRelease: {
		Requested: Released, Provisioning: Released, Active: Released, Idle: Released, Stopped: Released,
		Restarting: Released, RestartFailed: Released, Releasing: Released, ReleaseFailed: Released,
	},
	Complete: {Active: Completed, Idle: Completed},
}

// repeats are the (event, status) pairs that restate the persisted status: a report the
// agent sends again, or a suspension that finds the allocation already stopped. They
// change nothing and write nothing (no status event, no audit row).
var repeats = map[Event]map[Status]bool{
	ProvisionStarted: {Provisioning: true},
	Provisioned:      {Active: true},
	ProvisionFailed:  {Failed: true},
	WentIdle:         {Idle: true},
	BecameBusy:       {Active: true},
	RestartOK:        {Active: true},
	RestartFailedEv:  {RestartFailed: true},
	ReleaseOK:        {Released: true},
	ReleaseFailedEv:  {ReleaseFailed: true},
	Stop:             {Stopped: true},
}

// IsFinal reports whether s has no way out: released, failed, completed.
func IsFinal(s Status) bool { return s == Released || s == Failed || s == Completed }

// Usage says what entering a status does to the allocation's billing usage record.
type Usage string

const (
	// UsageOpen opens a usage record unless one is open (billing runs).
	UsageOpen Usage = "open"
	// UsageKeep leaves the usage record as it is (open or not).
	UsageKeep Usage = "keep"
	// UsageClose closes the open usage record, if any (billing stops).
	UsageClose Usage = "close"
)

// UsageOnEntry is the billing effect of entering s (issue 5 item 5; docs table).
func UsageOnEntry(s Status) Usage {
	switch s {
	case Active:
		return UsageOpen
	case Stopped, Released, ReleaseFailed, Failed, Completed:
		return UsageClose
	}
	return UsageKeep
}

// HoldsGPUs reports whether an allocation in s keeps its reserved GPUs. The GPUs are
// freed on entering released, failed or completed. A release_failed allocation keeps
// them: the node may still run its processes until a retry or a force-release.
func HoldsGPUs(s Status) bool { return !IsFinal(s) }

// Outcome is the result of an allowed move.
type Outcome struct {
	From, To Status
	Event    Event
	// Changed is false for a repeat: nothing is written.
	Changed bool
	// CleanupNode is set by force_release: the node must be flagged for cleanup, since
	// nothing confirmed that the workload is gone from it.
	CleanupNode bool
}

// ErrForbidden is wrapped by every refused move.
var ErrForbidden = errors.New("lifecycle: move not allowed")

// ErrUnknown is wrapped for a status or event outside the table (a bug, or a corrupt row).
var ErrUnknown = errors.New("lifecycle: unknown status or event")

func known(s Status, e Event) bool {
	okS, okE := false, false
	for _, x := range Statuses {
		okS = okS || x == s
	}
	for _, x := range Events {
		okE = okE || x == e
	}
	return okS && okE
}

// Apply is the move event e makes from status from: an Outcome, or the contract error
// of a forbidden move (wrapping ErrForbidden).
func Apply(from Status, e Event) (Outcome, error) {
	if !known(from, e) {
		return Outcome{From: from, To: from, Event: e}, fmt.Errorf("%w: %q on %q", ErrUnknown, e, from)
	}
	if to, ok := transitions[e][from]; ok {
		return Outcome{From: from, To: to, Event: e, Changed: true, CleanupNode: e == ForceRelease}, nil
	}
	if repeats[e][from] {
		return Outcome{From: from, To: from, Event: e}, nil
	}
	return Outcome{From: from, To: from, Event: e}, refusal(from, e)
}

// refusal is the error of a forbidden move. In order:
//   - the release flow owns the allocation: any command on releasing, and release,
//     retry_release or force_release on released, is allocation_already_releasing;
//   - any other command is allocation_not_active: the allocation is not in a status the
//     command needs (not started yet, or already over);
//   - a report that does not fit (late, out of order) is 409 invalid_request with
//     details.reason allocation_transition_invalid; the caller drops it and logs.
func refusal(from Status, e Event) *apierr.Error {
	var err *apierr.Error
	switch {
	case e.IsReport():
		err = apierr.New(apierr.InvalidRequest, "%s does not apply to a %s allocation", e, from).
			WithStatus(409).With("reason", "allocation_transition_invalid")
	case from == Releasing, from == Released && (e == Release || e == RetryRelease || e == ForceRelease):
		err = apierr.New(apierr.AllocationAlreadyReleasing, "the allocation is already %s", from)
		if from == Released {
			err.With("reason", "already_released")
		} else {
			err.With("reason", "release_in_progress")
		}
	default:
		err = apierr.New(apierr.AllocationNotActive, "cannot %s a %s allocation", strings.ReplaceAll(string(e), "_", " "), from).
			With("reason", notActiveReason(from))
	}
	return err.With("from", string(from)).With("event", string(e)).Wrap(ErrForbidden)
}

func notActiveReason(from Status) string {
	switch {
	case IsFinal(from):
		return "final_state"
	case from == Requested || from == Provisioning:
		return "not_started"
	}
	return "status_not_eligible"
}
