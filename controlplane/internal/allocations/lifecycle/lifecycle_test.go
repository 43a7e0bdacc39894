package lifecycle_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/lifecycle"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// expected is the table written out by hand, independently of the code: one row per
// status in lifecycle.Statuses order, one column per event in lifecycle.Events order
// (provision_started, provisioned, provision_failed, went_idle, became_busy, restart_ok,
// restart_failed, release_ok, release_failed, stop, restart, release, retry_release,
// force_release, complete). A status name is the move's target; "=" a repeat that
// writes nothing; I = 409 invalid_request (allocation_transition_invalid); N =
// allocation_not_active; R = allocation_already_releasing.
var expected = map[lifecycle.Status]string{
	"requested":      "provisioning active failed I I I I I I N N releasing N released N",
	"provisioning":   "= active failed I I I I I I N N releasing N released N",
	"active":         "I = I idle = = I I I stopped restarting releasing N released completed",
	"idle":           "I I I = active I I I I stopped restarting releasing N released completed",
	"stopped":        "I I I I I I I I I = restarting releasing N released N",
	"restarting":     "I I I I I active restart_failed I I stopped N releasing N released N",
	"restart_failed": "I I I I I I = I I stopped restarting releasing N released N",
	"releasing":      "I I I I I I I released release_failed R R R R released R",
	"release_failed": "I I I I I I I I = N N releasing releasing released N",
	"released":       "I I I I I I I = I N N R R R N",
	"failed":         "I I = I I I I I I N N N N N N",
	"completed":      "I I I I I I I I I N N N N N N",
}

func TestEveryStatusAndEventPair(t *testing.T) {
	if len(lifecycle.Statuses) != 12 || len(expected) != 12 {
		t.Fatalf("seed §3 has 12 workload statuses; table has %d, test %d", len(lifecycle.Statuses), len(expected))
	}
	pairs := 0
	for _, from := range lifecycle.Statuses {
		row := strings.Fields(expected[from])
		if len(row) != len(lifecycle.Events) {
			t.Fatalf("%s: %d cells for %d events", from, len(row), len(lifecycle.Events))
		}
		for i, ev := range lifecycle.Events {
			pairs++
			want := row[i]
			out, err := lifecycle.Apply(from, ev)
			var code apierr.Code
			switch want {
			case "I":
				code = apierr.InvalidRequest
			case "N":
				code = apierr.AllocationNotActive
			case "R":
				code = apierr.AllocationAlreadyReleasing
			}
			if code != "" {
				e, ok := apierr.As(err)
				if !ok || e.Code != code || !errors.Is(err, lifecycle.ErrForbidden) {
					t.Errorf("%s + %s: got %+v, %v; want %s", from, ev, out, err, code)
					continue
				}
				if e.HTTPStatus() != 409 {
					t.Errorf("%s + %s: status %d, want 409", from, ev, e.HTTPStatus())
				}
				if e.Details["from"] != string(from) || e.Details["event"] != string(ev) || e.Details["reason"] == nil {
					t.Errorf("%s + %s: details %v", from, ev, e.Details)
				}
				if code == apierr.InvalidRequest && e.Details["reason"] != "allocation_transition_invalid" {
					t.Errorf("%s + %s: reason %v", from, ev, e.Details["reason"])
				}
				if out.Changed || out.To != from {
					t.Errorf("%s + %s: refused move changed state: %+v", from, ev, out)
				}
				continue
			}
			if err != nil {
				t.Errorf("%s + %s: %v, want %s", from, ev, err, want)
				continue
			}
			if want == "=" {
				if out.Changed || out.To != from {
					t.Errorf("%s + %s: got %+v, want a repeat", from, ev, out)
				}
				continue
			}
			if !out.Changed || out.To != lifecycle.Status(want) || out.From != from || out.Event != ev {
				t.Errorf("%s + %s: got %+v, want → %s", from, ev, out, want)
			}
			if out.CleanupNode != (ev == lifecycle.ForceRelease) {
				t.Errorf("%s + %s: CleanupNode %v", from, ev, out.CleanupNode)
			}
		}
	}
	if pairs != 12*15 {
		t.Fatalf("walked %d pairs", pairs)
	}
}

func TestFinalStatusesHaveNoExits(t *testing.T) {
	for _, s := range lifecycle.Statuses {
		final := s == lifecycle.Released || s == lifecycle.Failed || s == lifecycle.Completed
		if lifecycle.IsFinal(s) != final {
			t.Errorf("IsFinal(%s) = %v", s, !final)
		}
		if lifecycle.HoldsGPUs(s) == final {
			t.Errorf("HoldsGPUs(%s) = %v", s, !final)
		}
		if !final {
			continue
		}
		for _, e := range lifecycle.Events {
			if out, err := lifecycle.Apply(s, e); err == nil && out.Changed {
				t.Errorf("final %s left by %s to %s", s, e, out.To)
			}
		}
	}
}

// Every non-final status can reach a final one, and every status is reachable from
// requested: the table has no dead ends and no orphans.
func TestReachability(t *testing.T) {
	reach := func(from lifecycle.Status) map[lifecycle.Status]bool {
		seen := map[lifecycle.Status]bool{from: true}
		queue := []lifecycle.Status{from}
		for len(queue) > 0 {
			s := queue[0]
			queue = queue[1:]
			for _, e := range lifecycle.Events {
				if out, err := lifecycle.Apply(s, e); err == nil && !seen[out.To] {
					seen[out.To] = true
					queue = append(queue, out.To)
				}
			}
		}
		return seen
	}
	all := reach(lifecycle.Requested)
	for _, s := range lifecycle.Statuses {
		if !all[s] {
			t.Errorf("%s unreachable from requested", s)
		}
		if lifecycle.IsFinal(s) {
			continue
		}
		if !reach(s)[lifecycle.Released] {
			t.Errorf("%s cannot reach released", s)
		}
		// An admin can always end a non-final allocation in one move.
		if out, err := lifecycle.Apply(s, lifecycle.ForceRelease); err != nil || out.To != lifecycle.Released {
			t.Errorf("force_release from %s: %+v %v", s, out, err)
		}
	}
}

func TestUsageOnEntry(t *testing.T) {
	want := map[lifecycle.Status]lifecycle.Usage{
		"requested": "keep", "provisioning": "keep", "active": "open", "idle": "keep", "stopped": "close",
		"restarting": "keep", "restart_failed": "keep", "releasing": "keep", "release_failed": "close",
		"released": "close", "failed": "close", "completed": "close",
	}
	for _, s := range lifecycle.Statuses {
		if got := lifecycle.UsageOnEntry(s); got != want[s] {
			t.Errorf("UsageOnEntry(%s) = %s, want %s", s, got, want[s])
		}
	}
}

func TestUnknownStatusOrEvent(t *testing.T) {
	if _, err := lifecycle.Apply("bogus", lifecycle.Release); !errors.Is(err, lifecycle.ErrUnknown) {
		t.Fatalf("unknown status: %v", err)
	}
	if _, err := lifecycle.Apply(lifecycle.Active, "bogus"); !errors.Is(err, lifecycle.ErrUnknown) {
		t.Fatalf("unknown event: %v", err)
	}
	if apierr.CodeOf(func() error { _, err := lifecycle.Apply("bogus", lifecycle.Release); return err }()) != apierr.InternalError {
		t.Fatal("an unknown status must surface as internal_error, not a client error")
	}
}

// The documented table is the code's table.
func TestDocumentedMatrixMatchesCode(t *testing.T) {
	doc, err := os.ReadFile("../../../../docs/allocation-lifecycle.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), lifecycle.Matrix()) {
		t.Fatalf("docs/allocation-lifecycle.md does not carry the current matrix; paste:\n%s", lifecycle.Matrix())
	}
}
