package maas_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/maas/maastest"
	"github.com/gantry-gpu/gantry/proto/api"
)

// Each injected MAAS failure leaves the onboarding failed at the step it hit, with a
// reason in Gantry's words; retry then carries it on to the agent's enrollment.
func TestInjectedFailuresRetry(t *testing.T) {
	cases := []struct {
		name     string
		spec     maastest.MachineSpec
		inject   func(sim *maastest.Server, sys string)
		midway   func(f *fixture, sys string, o api.MaasOnboarding) // while waiting for the failure
		heal     func(sim *maastest.Server, sys string)
		step     string
		inReason string
	}{
		{name: "failed commissioning", spec: maastest.MachineSpec{New: true},
			inject: func(sim *maastest.Server, sys string) { sim.Inject(sys, maastest.FailCommissioning) },
			step:   "commission", inReason: "Failed commissioning"},
		{name: "power failure on deploy", spec: maastest.MachineSpec{},
			inject: func(sim *maastest.Server, sys string) { sim.Inject(sys, maastest.PowerFailure) },
			step:   "wait_deployed", inReason: "Failed deployment"},
		{name: "missing while deploying", spec: maastest.MachineSpec{},
			midway: func(f *fixture, sys string, o api.MaasOnboarding) {
				f.waitFor(t, o, atStep("wait_deployed"))
				f.sim.SetMissing(sys, true)
			},
			heal: func(sim *maastest.Server, sys string) { sim.SetMissing(sys, false) },
			step: "wait_deployed", inReason: "Missing"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := setupSim(t, nil, maastest.Durations{Deploying: 300 * time.Millisecond}, nil)
			sys := f.sim.AddMachine(tc.spec)
			if tc.inject != nil {
				tc.inject(f.sim, sys)
			}
			r := f.onboard(t, sys)
			if r.StatusCode() != http.StatusAccepted {
				t.Fatalf("onboard: %d %s", r.StatusCode(), r.Body)
			}
			if tc.midway != nil {
				tc.midway(f, sys, *r.JSON202)
			}
			o := f.waitFor(t, *r.JSON202, func(o api.MaasOnboarding) bool { return o.State == api.MaasWorkflowStateFailed })
			if deref(o.CurrentStep) != tc.step || !strings.Contains(deref(o.FailureReason), tc.inReason) {
				t.Fatalf("failed at %s with %q, want %s with %q", deref(o.CurrentStep), deref(o.FailureReason), tc.step, tc.inReason)
			}
			if n := f.e.Count(t, `SELECT count(*) FROM audit_events WHERE target_id = $1 AND action = 'maas.onboarding.fail'`, o.ID.String()); n != 1 {
				t.Errorf("%d audited failures, want 1", n)
			}
			if tc.heal != nil {
				tc.heal(f.sim, sys)
			}
			rr, err := f.admin.RetryMaasOnboardingWithResponse(context.Background(), o.ID, &api.RetryMaasOnboardingParams{})
			if err != nil || rr.StatusCode() != http.StatusAccepted {
				t.Fatalf("retry: %v %s", err, rr.Body)
			}
			o = f.waitFor(t, o, func(o api.MaasOnboarding) bool {
				return deref(o.CurrentStep) == "wait_enrolled" || o.State == api.MaasWorkflowStateFailed
			})
			if o.State == api.MaasWorkflowStateFailed {
				t.Fatalf("retry failed at %s: %s", deref(o.CurrentStep), deref(o.FailureReason))
			}
		})
	}
}
