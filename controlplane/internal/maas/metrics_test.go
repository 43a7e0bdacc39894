package maas_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/riverqueue/river"

	"github.com/gantry-gpu/gantry/controlplane/internal/maas"
	"github.com/gantry-gpu/gantry/controlplane/internal/maas/maastest"
)

// The scheduled sync refreshes the age of each running step (what MaasOnboardingStuck
// watches), and /metrics counts workflows and step durations.
func TestStepAgeAndCounts(t *testing.T) {
	f := setup(t)
	sys := f.sim.AddMachine(maastest.MachineSpec{})
	r := f.onboard(t, sys)
	if r.StatusCode() != http.StatusAccepted {
		t.Fatalf("onboard: %d %s", r.StatusCode(), r.Body)
	}
	f.waitFor(t, *r.JSON202, atStep("wait_enrolled"))
	if err := (&maas.SyncWorker{Svc: f.e.App.Maas}).Work(context.Background(), &river.Job[maas.SyncArgs]{}); err != nil {
		t.Fatal(err)
	}
	families, err := f.e.App.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch mf.GetName() {
			case "gantry_maas_step_age_seconds":
				if labels["workflow"] == "onboarding" && labels["step"] == "wait_enrolled" && m.GetGauge().GetValue() >= 0 {
					found["age"] = true
				}
			case "gantry_maas_workflows_started_total":
				if labels["workflow"] == "onboarding" && m.GetCounter().GetValue() == 1 {
					found["started"] = true
				}
			case "gantry_maas_step_duration_seconds":
				if labels["step"] == "deploy" && labels["result"] == "succeeded" && m.GetHistogram().GetSampleCount() == 1 {
					found["deploy"] = true
				}
			}
		}
	}
	for _, k := range []string{"age", "started", "deploy"} {
		if !found[k] {
			t.Errorf("metric %s missing: %v", k, found)
		}
	}
	// The sync job also imported the machine.
	if n := f.e.Count(t, `SELECT count(*) FROM maas_machines WHERE system_id = $1`, sys); n != 1 {
		t.Errorf("scheduled sync imported %d rows for the machine", n)
	}
}
