package maas_test

import (
	"context"
	"net/http"
	"slices"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/maas/maastest"
	"github.com/gantry-gpu/gantry/proto/api"
)

// A profile's labels reach the node the onboarding creates: exactly those labels, in
// the node record written by create_node and in the admin node view (GET and list); a
// node onboarded with the label-less profile has none.
func TestOnboardingGivesTheNodeTheProfileLabels(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	labels := []string{"gantry.dev/rack=r12", "tier=gold", "team=ml-infra"}
	region := "rack-a"
	prof, err := f.admin.CreateMaasProfileWithResponse(ctx, &api.CreateMaasProfileParams{}, api.CreateMaasProfileJSONRequestBody{Name: "labelled",
		OsImageID: f.profile.OsImageID, Skus: []string{"h100-80gb.8x"}, Labels: labels, Region: &region})
	if err != nil || prof.StatusCode() != http.StatusCreated {
		t.Fatalf("profile: %v %s", err, prof.Body)
	}

	onboard := func(profileID uuid.UUID) uuid.UUID {
		t.Helper()
		sys := f.sim.AddMachine(maastest.MachineSpec{})
		r, err := f.admin.CreateMaasOnboardingWithResponse(ctx, f.site.ID, &api.CreateMaasOnboardingParams{},
			api.CreateMaasOnboardingJSONRequestBody{ProfileID: profileID, SystemID: &sys})
		if err != nil || r.StatusCode() != http.StatusAccepted {
			t.Fatalf("onboard: %v %s", err, r.Body)
		}
		o := f.waitFor(t, *r.JSON202, atStep("wait_enrolled"))
		if o.NodeID == nil {
			t.Fatalf("no node after create_node: %+v", o)
		}
		return *o.NodeID
	}
	labelled := onboard(prof.JSON201.ID)
	plain := onboard(f.profile.ID)

	n, err := f.admin.GetNodeWithResponse(ctx, labelled, &api.GetNodeParams{})
	if err != nil || n.JSON200 == nil {
		t.Fatalf("get node: %v", err)
	}
	if !slices.Equal(n.JSON200.Labels, labels) {
		t.Errorf("GET node labels %q, want %q", n.JSON200.Labels, labels)
	}
	if got := f.e.Count(t, `SELECT count(*) FROM nodes WHERE id = $1 AND labels = $2::text[]`, labelled, labels); got != 1 {
		t.Errorf("the node record does not hold exactly the profile's labels")
	}
	list, err := f.admin.ListNodesWithResponse(ctx, &api.ListNodesParams{})
	if err != nil || list.JSON200 == nil {
		t.Fatalf("list nodes: %v", err)
	}
	seen := 0
	for _, it := range list.JSON200.Items {
		switch it.ID {
		case labelled:
			seen++
			if !slices.Equal(it.Labels, labels) {
				t.Errorf("listed labels %q, want %q", it.Labels, labels)
			}
		case plain:
			seen++
			if it.Labels == nil || len(it.Labels) != 0 {
				t.Errorf("node of the label-less profile lists labels %#v, want []", it.Labels)
			}
		}
	}
	if seen != 2 {
		t.Errorf("list shows %d of the 2 onboarded nodes", seen)
	}
}
