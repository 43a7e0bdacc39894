package invoices

import (
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Invoice statuses (seed §3).
const (
	StatusDraft         = "draft"
	StatusIssued        = "issued"
	StatusDue           = "due"
	StatusPartiallyPaid = "partially_paid"
	StatusPaid          = "paid"
	StatusVoid          = "void"
	StatusWriteOff      = "write_off"
)

// Statuses lists every status, in lifecycle order.
var Statuses = []string{StatusDraft, StatusIssued, StatusDue, StatusPartiallyPaid, StatusPaid, StatusVoid, StatusWriteOff}

// Event is what happens to an invoice.
type Event string

// Events.
const (
	EvIssue      Event = "issue"       // numbered and frozen
	EvOpen       Event = "open"        // an amount is left to collect: payment terms run
	EvPayPartial Event = "pay_partial" // a payment that leaves an amount due
	EvPayInFull  Event = "pay_in_full" // a payment that settles what is due
	EvVoid       Event = "void"        // cancelled (a prepaid amount is re-credited)
	EvWriteOff   Event = "write_off"   // uncollectable
)

// Events lists the events.
var Events = []Event{EvIssue, EvOpen, EvPayPartial, EvPayInFull, EvVoid, EvWriteOff}

// transitions is the one table of legal moves (docs/invoices.md has it as a table). A
// fully prepaid invoice stays issued (nothing to collect); void is refused once a
// payment was applied after issue (refund the payment first); paid, void and write_off
// are final.
var transitions = map[string]map[Event]string{
	StatusDraft:         {EvIssue: StatusIssued, EvVoid: StatusVoid},
	StatusIssued:        {EvOpen: StatusDue, EvVoid: StatusVoid},
	StatusDue:           {EvPayPartial: StatusPartiallyPaid, EvPayInFull: StatusPaid, EvVoid: StatusVoid, EvWriteOff: StatusWriteOff},
	StatusPartiallyPaid: {EvPayPartial: StatusPartiallyPaid, EvPayInFull: StatusPaid, EvWriteOff: StatusWriteOff},
	StatusPaid:          {},
	StatusVoid:          {},
	StatusWriteOff:      {},
}

// Next is the status ev moves an invoice in from to, or the refusal naming the current
// status (409, reason invoice_state_invalid).
func Next(from string, ev Event) (string, error) {
	to, ok := transitions[from][ev]
	if !ok {
		return "", stateInvalid(from, ev)
	}
	return to, nil
}

func stateInvalid(from string, ev Event) *apierr.Error {
	return apierr.New(apierr.InvalidRequest, "a %s invoice cannot be moved by %s", from, ev).
		WithStatus(409).With("reason", "invoice_state_invalid").With("status", from).With("event", string(ev))
}
