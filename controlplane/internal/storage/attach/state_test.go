package attach

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// TestStateTable walks every (state, event) pair against the documented table,
// including the refused moves.
func TestStateTable(t *testing.T) {
	want := map[State]map[Event]string{
		Attaching: {AttachOK: "attached", AttachFailed: "failed", Detach: "detaching", DetachOK: "-", DetachFailed: "-", AllocationEnded: "detached"},
		Attached:  {AttachOK: "=", AttachFailed: "-", Detach: "detaching", DetachOK: "-", DetachFailed: "-", AllocationEnded: "detached"},
		Detaching: {AttachOK: "-", AttachFailed: "-", Detach: "=", DetachOK: "detached", DetachFailed: "attached", AllocationEnded: "detached"},
		Detached:  {AttachOK: "-", AttachFailed: "-", Detach: "=", DetachOK: "=", DetachFailed: "-", AllocationEnded: "="},
		Failed:    {AttachOK: "-", AttachFailed: "=", Detach: "detached", DetachOK: "-", DetachFailed: "-", AllocationEnded: "="},
	}
	for _, s := range States {
		for _, e := range Events {
			out, err := Apply(s, e)
			got := string(out.To)
			var refused ErrRefused
			switch {
			case errors.As(err, &refused):
				got = "-"
				if out.Changed || out.To != s {
					t.Errorf("%s + %s refused but moved to %s", s, e, out.To)
				}
			case err != nil:
				t.Fatalf("%s + %s: %v", s, e, err)
			case !out.Changed:
				got = "="
			}
			if got != want[s][e] {
				t.Errorf("%s + %s = %s, want %s", s, e, got, want[s][e])
			}
		}
	}
}

// TestStateInvariants: only live states want a task or hold a mount path, and every
// state an allocation's end reaches is final.
func TestStateInvariants(t *testing.T) {
	for _, s := range States {
		if (s.Task() != "") != (s == Attaching || s == Detaching) {
			t.Errorf("%s wants task %q", s, s.Task())
		}
		out, err := Apply(s, AllocationEnded)
		if err != nil || out.To.Live() {
			t.Errorf("%s + allocation_ended = %s (%v): an ended allocation keeps a live attachment", s, out.To, err)
		}
	}
}

// TestDocumentedMatrix: docs/storage.md carries the table Matrix renders.
func TestDocumentedMatrix(t *testing.T) {
	doc, err := os.ReadFile("../../../../docs/storage.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), Matrix()) {
		t.Fatalf("docs/storage.md does not carry the attachment state table; it should contain:\n%s", Matrix())
	}
}
