package attach

import (
	"fmt"
	"strings"
)

// State is an attachment's state.
type State string

// States.
const (
	// Attaching: the storage.attach task is on its way to, or running on, the node; or,
	// for an attachment named by an allocation create, it waits with no task yet for the
	// allocation to become active (AllocationActive gives it its task).
	Attaching State = "attaching"
	// Attached: the agent reported the bucket visible in the allocation (method says how).
	Attached State = "attached"
	// Detaching: the storage.detach task is on its way to, or running on, the node (a rw
	// copy-mode attachment uploads its changes now).
	Detaching State = "detaching"
	// Detached: gone from the allocation; final.
	Detached State = "detached"
	// Failed: the attach did not succeed (error says why); nothing is mounted. Final,
	// except that a DELETE moves it to detached.
	Failed State = "failed"
)

// States lists every state in the documented order.
var States = []State{Attaching, Attached, Detaching, Detached, Failed}

// Event is what moves an attachment.
type Event string

// Events.
const (
	// AttachOK: the agent reported the attach task succeeded.
	AttachOK Event = "attach_ok"
	// AttachFailed: the agent reported the attach failed, refused the task, or the task
	// was not acknowledged or reported in time.
	AttachFailed Event = "attach_failed"
	// Detach: a user asked to detach (DELETE).
	Detach Event = "detach"
	// DetachOK: the agent reported the detach task succeeded.
	DetachOK Event = "detach_ok"
	// DetachFailed: the agent could not detach (a rw copy could not upload every
	// change): the bucket stays attached, with the error shown; DELETE retries.
	DetachFailed Event = "detach_failed"
	// AllocationEnded: the allocation reached released, failed or completed; its node
	// holds nothing of it any more.
	AllocationEnded Event = "allocation_ended"
)

// Events lists every event in the documented order.
var Events = []Event{AttachOK, AttachFailed, Detach, DetachOK, DetachFailed, AllocationEnded}

// Task is the task a state wants the node to run ("" for none).
func (s State) Task() string {
	switch s {
	case Attaching:
		return "storage.attach"
	case Detaching:
		return "storage.detach"
	}
	return ""
}

// Live reports whether the attachment occupies its mount path and may be served to its
// node over the fabric.
func (s State) Live() bool { return s == Attaching || s == Attached || s == Detaching }

// transitions is the whole state machine: from → event → to. A pair missing here is
// refused; a move to the same state is a repeat (nothing written).
var transitions = map[State]map[Event]State{
	Attaching: {AttachOK: Attached, AttachFailed: Failed, Detach: Detaching, AllocationEnded: Detached},
	Attached:  {AttachOK: Attached, Detach: Detaching, AllocationEnded: Detached},
	Detaching: {Detach: Detaching, DetachOK: Detached, DetachFailed: Attached, AllocationEnded: Detached},
	Detached:  {Detach: Detached, DetachOK: Detached, AllocationEnded: Detached},
	Failed:    {AttachFailed: Failed, Detach: Detached, AllocationEnded: Failed},
}

// Outcome is the result of applying an event.
type Outcome struct {
	From, To State
	// Changed is false for a repeat.
	Changed bool
}

// ErrRefused is an event the state does not allow.
type ErrRefused struct {
	From  State
	Event Event
}

func (e ErrRefused) Error() string {
	return fmt.Sprintf("attachment %s: %s not allowed", e.From, e.Event)
}

// Apply decides the move of event e from state s.
func Apply(s State, e Event) (Outcome, error) {
	to, ok := transitions[s][e]
	if !ok {
		return Outcome{From: s, To: s}, ErrRefused{From: s, Event: e}
	}
	return Outcome{From: s, To: to, Changed: to != s}, nil
}

// Matrix renders the state machine as the Markdown table docs/storage.md carries: a
// row per state, a column per event; "→ x" a move, "=" a repeat, "—" refused.
func Matrix() string {
	var b strings.Builder
	b.WriteString("| from \\ event |")
	for _, e := range Events {
		b.WriteString(" " + string(e) + " |")
	}
	b.WriteString("\n|---|")
	for range Events {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, s := range States {
		b.WriteString("| **" + string(s) + "** |")
		for _, e := range Events {
			out, err := Apply(s, e)
			switch {
			case err != nil:
				b.WriteString(" — |")
			case !out.Changed:
				b.WriteString(" = |")
			default:
				b.WriteString(" → " + string(out.To) + " |")
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}
