package lifecycle_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances/lifecycle"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// expected is the table written out by hand, independently of the code: one row per
// state in lifecycle.States order, one column per event in lifecycle.Events order
// (reported_starting, reported_running, reported_unhealthy, reported_stopped,
// reported_failed, start, health_timeout, stop, allocation_ended). A state name is the
// move's target; "=" a repeat that writes nothing; I = 409 invalid_request
// (app_instance_transition_invalid, a dropped report); S = app_instance_state_invalid.
var expected = map[lifecycle.State]string{
	"requested": "starting running starting I failed starting S stopped stopped",
	"starting":  "= running = failed failed = failed stopping stopped",
	"running":   "starting = unhealthy failed failed = S stopping stopped",
	"unhealthy": "starting running = failed failed = failed stopping stopped",
	"stopping":  "= = = stopped stopped S S S stopped",
	"stopped":   "I I I = = S S S =",
	"failed":    "I I I = = S S S =",
}

func TestEveryStateAndEventPair(t *testing.T) {
	if len(lifecycle.States) != 7 || len(expected) != 7 {
		t.Fatalf("7 app instance states; table has %d, test %d", len(lifecycle.States), len(expected))
	}
	pairs := 0
	for _, from := range lifecycle.States {
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
			case "S":
				code = apierr.AppInstanceStateInvalid
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
				if code == apierr.InvalidRequest && e.Details["reason"] != "app_instance_transition_invalid" {
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
			if !out.Changed || out.To != lifecycle.State(want) || out.From != from || out.Event != ev {
				t.Errorf("%s + %s: got %+v, want → %s", from, ev, out, want)
			}
		}
	}
	if pairs != 7*9 {
		t.Fatalf("walked %d pairs", pairs)
	}
}

func TestFinalStatesHaveNoExits(t *testing.T) {
	for _, s := range lifecycle.States {
		final := s == lifecycle.Stopped || s == lifecycle.Failed
		if lifecycle.IsFinal(s) != final || lifecycle.IsLive(s) == final {
			t.Errorf("IsFinal/IsLive(%s) wrong", s)
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

// Every state is reachable from requested, and every live state can reach stopped and
// failed: no dead ends, no orphans; the end of the allocation always ends the instance.
func TestReachability(t *testing.T) {
	reach := func(from lifecycle.State) map[lifecycle.State]bool {
		seen := map[lifecycle.State]bool{from: true}
		queue := []lifecycle.State{from}
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
	for _, s := range lifecycle.States {
		if !all[s] {
			t.Errorf("%s unreachable from requested", s)
		}
		if lifecycle.IsFinal(s) {
			continue
		}
		if r := reach(s); !r[lifecycle.Stopped] {
			t.Errorf("%s cannot reach stopped", s)
		}
		if out, err := lifecycle.Apply(s, lifecycle.AllocationEnded); err != nil || out.To != lifecycle.Stopped {
			t.Errorf("allocation_ended from %s: %+v %v", s, out, err)
		}
	}
}

func TestFromReport(t *testing.T) {
	for state, ev := range map[string]lifecycle.Event{
		"starting": lifecycle.ReportedStarting, "running": lifecycle.ReportedRunning, "unhealthy": lifecycle.ReportedUnhealthy,
		"stopped": lifecycle.ReportedStopped, "failed": lifecycle.ReportedFailed, "requested": "", "stopping": "", "": "", "RUNNING": "",
	} {
		if got := lifecycle.FromReport(state); got != ev {
			t.Errorf("FromReport(%q) = %q, want %q", state, got, ev)
		}
	}
}

func TestUnknownStateOrEvent(t *testing.T) {
	if _, err := lifecycle.Apply("bogus", lifecycle.Stop); !errors.Is(err, lifecycle.ErrUnknown) {
		t.Fatalf("unknown state: %v", err)
	}
	_, err := lifecycle.Apply(lifecycle.Running, "bogus")
	if !errors.Is(err, lifecycle.ErrUnknown) || apierr.CodeOf(err) != apierr.InternalError {
		t.Fatalf("unknown event: %v (must surface as internal_error)", err)
	}
}

// The documented table is the code's table.
func TestDocumentedMatrixMatchesCode(t *testing.T) {
	doc, err := os.ReadFile("../../../../../docs/apps.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), lifecycle.Matrix()) {
		t.Fatalf("docs/apps.md does not carry the current matrix; paste:\n%s", lifecycle.Matrix())
	}
}
