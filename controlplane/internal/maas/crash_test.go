package maas_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/proto/api"
)

// Every step of an onboarding "crashes" once after its MAAS calls and writes but before
// its transaction commits (rolled back, as a killed process's would be); River runs the
// step again. The onboarding still succeeds with one allocate, one deploy, one node
// record and one audited end per step.
func TestCrashBeforeEachCommitResumes(t *testing.T) {
	f := setupWith(t, enrollingBooter)
	var mu sync.Mutex
	crashed := map[string]bool{}
	f.e.App.Maas.BeforeCommit = func(_ context.Context, _ string, _ uuid.UUID, step string) error {
		mu.Lock()
		defer mu.Unlock()
		if crashed[step] {
			return nil
		}
		crashed[step] = true
		return errors.New("simulated crash before commit")
	}
	o, sys := f.onboarded(t)
	mu.Lock()
	n := len(crashed)
	mu.Unlock()
	if n < 6 { // allocate, create_node, deploy, wait_deployed, wait_enrolled, uncordon
		t.Fatalf("only %d steps crashed: %v", n, crashed)
	}
	if got := deploys(f.sim, sys); got != 1 {
		t.Errorf("deploy calls %d, want 1", got)
	}
	allocs := 0
	for _, c := range f.sim.Calls() {
		if c.Op == "allocate" {
			allocs++
		}
	}
	if allocs != 1 {
		t.Errorf("allocate calls %d, want 1", allocs)
	}
	if c := f.e.Count(t, `SELECT count(*) FROM nodes`); c != 1 {
		t.Errorf("%d node records, want 1", c)
	}
	if c := f.e.Count(t, `SELECT count(*) FROM audit_events WHERE target_id = $1 AND action = 'maas.onboarding.step'`, o.ID.String()); c != 6 {
		// commission is skipped for a Ready machine, recorded with allocate's end.
		t.Errorf("%d audited step ends, want 6 (one per step run)", c)
	}
	if o.State != api.MaasWorkflowStateSucceeded {
		t.Errorf("state %s", o.State)
	}
	// Domain events commit with their step: one per step end (the crashed ones rolled
	// back with their transaction), plus started and succeeded.
	for typ, want := range map[string]int{"maas.onboarding.started": 1, "maas.onboarding.step_finished": 6, "maas.onboarding.succeeded": 1} {
		if c := f.e.Count(t, `SELECT count(*) FROM outbox_events WHERE event_type = $1 AND payload->>'maas_onboarding_id' = $2`, typ, o.ID.String()); c != want {
			t.Errorf("%d %s events, want %d", c, typ, want)
		}
	}

	// The same for every decommission step.
	r := f.decommission(t, *o.NodeID, api.CreateNodeDecommissionJSONRequestBody{})
	if r.JSON202 == nil {
		t.Fatalf("decommission: %d %s", r.StatusCode(), r.Body)
	}
	d := f.waitDecommission(t, r.JSON202.ID)
	if d.State != api.MaasWorkflowStateSucceeded {
		t.Fatalf("decommission %s: %s", d.State, deref(d.FailureReason))
	}
	for _, step := range []string{"cordon", "drain", "revoke_token", "release", "retire"} {
		mu.Lock()
		ok := crashed[step]
		mu.Unlock()
		if !ok {
			t.Errorf("step %s did not crash", step)
		}
	}
	releases := 0
	for _, c := range f.sim.Calls() {
		if c.Op == "release" {
			releases++
		}
	}
	if releases != 1 {
		t.Errorf("release calls %d, want 1", releases)
	}
	if c := f.e.Count(t, `SELECT count(*) FROM nodes`); c != 0 {
		t.Errorf("node not retired")
	}
}
