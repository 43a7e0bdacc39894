package maas_test

import (
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/maas/maastest"
	"github.com/gantry-gpu/gantry/proto/api"
)

// A decommission whose disk erase fails in MAAS is failed at release with the reason
// (the node stays: cordoned, drained, its token revoked). PATHS.md has no retry or abort
// for decommissions, so the operator re-runs it by creating a new decommission of the
// node: every step runs again and finds its work done (no second cordon/drain/revoke
// effect), release erases the machine again, the node is retired. The failed
// decommission stays, with its reason, as the record.
func TestFailedDecommissionReportsReasonAndReruns(t *testing.T) {
	f := setupWith(t, enrollingBooter)
	o, sys := f.onboarded(t)
	f.sim.Inject(sys, maastest.FailErasing)

	r := f.decommission(t, *o.NodeID, api.CreateNodeDecommissionJSONRequestBody{})
	if r.JSON202 == nil {
		t.Fatalf("decommission: %d %s", r.StatusCode(), r.Body)
	}
	d := f.waitDecommission(t, r.JSON202.ID)
	if d.State != api.MaasWorkflowStateFailed || deref(d.CurrentStep) != "release" || !strings.Contains(deref(d.FailureReason), "Failed disk erasing") {
		t.Fatalf("decommission %s at %s: %q, want failed at release with MAAS's status", d.State, deref(d.CurrentStep), deref(d.FailureReason))
	}
	if rel := d.Steps[3]; rel.Name != "release" || rel.State != api.MaasWorkflowStepStateFailed || deref(rel.Reason) != deref(d.FailureReason) {
		t.Errorf("release step %+v", rel)
	}
	if n := f.e.Count(t, `SELECT count(*) FROM nodes WHERE id = $1 AND schedule_state = 'drained'`, *o.NodeID); n != 1 {
		t.Errorf("the node of a failed decommission is not kept drained")
	}
	if n := f.e.Count(t, `SELECT count(*) FROM audit_events WHERE target_id = $1 AND action = 'maas.decommission.fail'`, d.ID.String()); n != 1 {
		t.Errorf("%d audited failures", n)
	}
	if n := f.e.Count(t, `SELECT count(*) FROM outbox_events WHERE event_type = 'maas.decommission.failed' AND payload->>'reason' = $1`, deref(d.FailureReason)); n != 1 {
		t.Errorf("%d failure events carrying the reason", n)
	}

	r2 := f.decommission(t, *o.NodeID, api.CreateNodeDecommissionJSONRequestBody{})
	if r2.JSON202 == nil || r2.JSON202.ID == d.ID {
		t.Fatalf("re-run: %d %s", r2.StatusCode(), r2.Body)
	}
	// While it runs a third is refused as before.
	if r3 := f.decommission(t, *o.NodeID, api.CreateNodeDecommissionJSONRequestBody{}); r3.StatusCode() != 409 && r3.StatusCode() != 404 {
		t.Errorf("a second concurrent decommission: %d %s", r3.StatusCode(), r3.Body)
	}
	d2 := f.waitDecommission(t, r2.JSON202.ID)
	if d2.State != api.MaasWorkflowStateSucceeded {
		t.Fatalf("re-run %s at %s: %s", d2.State, deref(d2.CurrentStep), deref(d2.FailureReason))
	}
	m, _ := f.sim.Machine(sys)
	if m.Releases != 2 || m.Status != maastest.StatusReady || m.LastErase != "quick" {
		t.Errorf("machine after the re-run: %d releases, %v, erase %q; want 2 releases, Ready, quick", m.Releases, m.Status, m.LastErase)
	}
	if n := f.e.Count(t, `SELECT count(*) FROM nodes`); n != 0 {
		t.Errorf("node not retired")
	}
	first, err := f.admin.GetMaasDecommissionWithResponse(t.Context(), d.ID, &api.GetMaasDecommissionParams{})
	if err != nil || first.JSON200 == nil || first.JSON200.State != api.MaasWorkflowStateFailed || deref(first.JSON200.FailureReason) == "" {
		t.Errorf("the failed decommission's record: %v %+v", err, first.JSON200)
	}
}
