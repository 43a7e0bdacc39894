package maas_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/maas/maastest"
	"github.com/gantry-gpu/gantry/proto/api"
)

// The profile's storage layout is set in MAAS while each machine is still Ready, just
// before it is allocated: for a Ready machine onboarded by system id, for a New one
// (after commissioning) and for one MAAS chose by constraints (a dry-run allocate picks
// it, the choice is recorded, then layout and allocation).
func TestProfileStorageLayoutApplied(t *testing.T) {
	f := setup(t)
	lvm := api.MaasStorageLayoutLvm
	p, err := f.admin.UpdateMaasProfileWithResponse(context.Background(), f.profile.ID, &api.UpdateMaasProfileParams{},
		api.UpdateMaasProfileJSONRequestBody{StorageLayout: &lvm})
	if err != nil || p.JSON200 == nil || p.JSON200.StorageLayout != lvm {
		t.Fatalf("profile: %v %s", err, p.Body)
	}
	ready := f.sim.AddMachine(maastest.MachineSpec{})
	fresh := f.sim.AddMachine(maastest.MachineSpec{New: true})
	chosen := f.sim.AddMachine(maastest.MachineSpec{Tags: []string{"lvm-please"}})
	var ids []api.MaasOnboarding
	for _, sys := range []string{ready, fresh} {
		r := f.onboard(t, sys)
		if r.StatusCode() != http.StatusAccepted {
			t.Fatalf("onboard %s: %d %s", sys, r.StatusCode(), r.Body)
		}
		ids = append(ids, *r.JSON202)
	}
	r, err := f.admin.CreateMaasOnboardingWithResponse(context.Background(), f.site.ID, &api.CreateMaasOnboardingParams{},
		api.CreateMaasOnboardingJSONRequestBody{ProfileID: f.profile.ID, Constraints: &api.MaasMachineConstraints{Tags: []string{"lvm-please"}}})
	if err != nil || r.StatusCode() != http.StatusAccepted {
		t.Fatalf("onboard by constraints: %v %s", err, r.Body)
	}
	ids = append(ids, *r.JSON202)
	for _, o := range ids {
		f.waitFor(t, o, atStep("wait_enrolled"))
	}
	for _, sys := range []string{ready, fresh, chosen} {
		m, _ := f.sim.Machine(sys)
		if m.StorageLayout != "lvm" {
			t.Errorf("%s deployed with layout %q, want lvm", sys, m.StorageLayout)
		}
		if m.Allocations != 1 || m.Deploys != 1 {
			t.Errorf("%s: %d allocations, %d deploys, want 1 and 1", sys, m.Allocations, m.Deploys)
		}
		// MAAS (and the simulator) accept the layout only while the machine is Ready, so
		// an accepted set came before the allocation; none was refused.
		if m.LayoutSets < 1 {
			t.Errorf("%s: no accepted set_storage_layout", sys)
		}
		for _, c := range f.sim.Calls() {
			if c.SystemID == sys && c.Op == "set_storage_layout" && c.Status != http.StatusOK {
				t.Errorf("%s: set_storage_layout answered %d", sys, c.Status)
			}
		}
	}
}
