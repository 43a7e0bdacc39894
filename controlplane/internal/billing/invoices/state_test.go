package invoices

import (
	"errors"
	"testing"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

// legal is the transition table as docs/invoices.md states it; every other (status,
// event) pair must be refused naming the current status.
var legal = map[[2]string]string{
	{StatusDraft, string(EvIssue)}:              StatusIssued,
	{StatusDraft, string(EvVoid)}:               StatusVoid,
	{StatusIssued, string(EvOpen)}:              StatusDue,
	{StatusIssued, string(EvVoid)}:              StatusVoid,
	{StatusDue, string(EvPayPartial)}:           StatusPartiallyPaid,
	{StatusDue, string(EvPayInFull)}:            StatusPaid,
	{StatusDue, string(EvVoid)}:                 StatusVoid,
	{StatusDue, string(EvWriteOff)}:             StatusWriteOff,
	{StatusPartiallyPaid, string(EvPayPartial)}: StatusPartiallyPaid,
	{StatusPartiallyPaid, string(EvPayInFull)}:  StatusPaid,
	{StatusPartiallyPaid, string(EvWriteOff)}:   StatusWriteOff,
}

func TestEveryTransition(t *testing.T) {
	n := 0
	for _, from := range Statuses {
		for _, ev := range Events {
			to, err := Next(from, ev)
			want, ok := legal[[2]string{from, string(ev)}]
			if ok {
				n++
				if err != nil || to != want {
					t.Errorf("%s --%s--> %q, %v; want %s", from, ev, to, err, want)
				}
				continue
			}
			var e *apierr.Error
			if !errors.As(err, &e) || e.HTTPStatus() != 409 || e.Details["reason"] != "invoice_state_invalid" || e.Details["status"] != from {
				t.Errorf("%s --%s--> %q, %v; want 409 invoice_state_invalid naming %s", from, ev, to, err, from)
			}
		}
	}
	if n != len(legal) {
		t.Fatalf("walked %d legal moves, table has %d", n, len(legal))
	}
	// The table in the code has no move the test does not know.
	for from, moves := range transitions {
		for ev, to := range moves {
			if legal[[2]string{from, string(ev)}] != to {
				t.Errorf("code allows %s --%s--> %s, not in the documented table", from, ev, to)
			}
		}
	}
}
