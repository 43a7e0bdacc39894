package maas

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Workflow kinds.
const (
	KindOnboarding   = "onboarding"
	KindDecommission = "decommission"
)

// Steps of an onboarding, in order.
const (
	StepAllocate     = "allocate"
	StepCommission   = "commission"
	StepCreateNode   = "create_node"
	StepDeploy       = "deploy"
	StepWaitDeployed = "wait_deployed"
	StepWaitEnrolled = "wait_enrolled"
	StepUncordon     = "uncordon"
)

// Steps of a decommission, in order.
const (
	StepCordon      = "cordon"
	StepDrain       = "drain"
	StepRevokeToken = "revoke_token"
	StepRelease     = "release"
	StepRetire      = "retire"
)

// StepAbort is the step an aborting onboarding runs (release in MAAS, remove the node).
const StepAbort = "abort"

// OnboardingSteps and DecommissionSteps are the workflows' step orders.
var (
	OnboardingSteps   = []string{StepAllocate, StepCommission, StepCreateNode, StepDeploy, StepWaitDeployed, StepWaitEnrolled, StepUncordon}
	DecommissionSteps = []string{StepCordon, StepDrain, StepRevokeToken, StepRelease, StepRetire}
)

// Workflow and step states (the contract's MaasWorkflowState / MaasWorkflowStepState).
const (
	StatePending   = "pending"
	StateRunning   = "running"
	StateSucceeded = "succeeded"
	StateFailed    = "failed"
	StateAborting  = "aborting"
	StateAborted   = "aborted"
	StepSkipped    = "skipped"
)

// transitions is the workflow state machine: which states an event may leave from.
// (pending is not used by the workers: a workflow is running from the moment its first
// job is inserted.)
var transitions = map[string]map[string]string{
	"advance": {StateRunning: StateRunning},
	"finish":  {StateRunning: StateSucceeded},
	"fail":    {StateRunning: StateFailed},
	"retry":   {StateFailed: StateRunning},
	"abort":   {StateRunning: StateAborting, StateFailed: StateAborting, StatePending: StateAborting},
	"aborted": {StateAborting: StateAborted},
}

// transition is the state event leads to from from, and whether it is allowed.
func transition(from, event string) (string, bool) {
	to, ok := transitions[event][from]
	return to, ok
}

// Step is one step's visible record (stored in the workflow row's steps column).
type Step struct {
	Name       string     `json:"name"`
	State      string     `json:"state"`
	Attempts   int        `json:"attempts"`
	StartedAt  *time.Time `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
	DeadlineAt *time.Time `json:"deadline_at"`
	Reason     *string    `json:"reason"`
	// Intent is a write-ahead note of the current attempt (not shown in the API): what
	// it asked MAAS to do, so that a re-run after a crash recognises its own request.
	Intent string `json:"intent,omitempty"`
}

func newSteps(names []string) []Step {
	out := make([]Step, len(names))
	for i, n := range names {
		out[i] = Step{Name: n, State: StatePending}
	}
	return out
}

func stepIndex(steps []Step, name string) int {
	for i, s := range steps {
		if s.Name == name {
			return i
		}
	}
	return -1
}

// start marks steps[i] running now with its deadline.
func start(steps []Step, i int, now time.Time, timeout time.Duration) {
	dl := now.Add(timeout)
	steps[i].State = StateRunning
	steps[i].Attempts++
	steps[i].StartedAt = &now
	steps[i].FinishedAt = nil
	steps[i].DeadlineAt = &dl
	steps[i].Reason = nil
	steps[i].Intent = ""
}

func finish(steps []Step, i int, state string, now time.Time, reason string) {
	steps[i].State = state
	steps[i].FinishedAt = &now
	steps[i].DeadlineAt = nil
	if reason != "" {
		steps[i].Reason = &reason
	} else if state == StateSucceeded {
		steps[i].Reason = nil
	}
}

// Outcome is what one run of a step decided.
type Outcome struct {
	// Done: the step finished (Skip: it had nothing to do, with Reason).
	Done, Skip bool
	// Fail: the workflow fails with Reason.
	Fail bool
	// Reason is recorded on the step (for a wait: what it is waiting for).
	Reason string
	// Next overrides the next step.
	Next string
	// Apply runs in the transaction that records the step's end (writes that must
	// commit together with it: the node record, its token, a schedule change).
	Apply func(ctx context.Context, tx pgx.Tx) error
}

func done() Outcome                 { return Outcome{Done: true} }
func skip(reason string) Outcome    { return Outcome{Done: true, Skip: true, Reason: reason} }
func fail(reason string) Outcome    { return Outcome{Fail: true, Reason: reason} }
func waiting(reason string) Outcome { return Outcome{Reason: reason} }
