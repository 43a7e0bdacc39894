package maas_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/maas/maastest"
	"github.com/gantry-gpu/gantry/proto/api"
)

// Limits at their edges: names of 64 characters pass and 65 are refused, a profile's 16
// SKUs pass and 17 are refused, each refusal 422 validation_error with nothing stored.
func TestLimitsAtTheirEdges(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	name64 := "p" + strings.Repeat("a", 63)
	body := func(name string, skus int) api.CreateMaasProfileJSONRequestBody {
		s := make([]string, skus)
		for i := range s {
			s[i] = "h100-80gb.8x"
		}
		return api.CreateMaasProfileJSONRequestBody{Name: name, OsImageID: f.profile.OsImageID, Skus: s}
	}
	if r, err := f.admin.CreateMaasProfileWithResponse(ctx, &api.CreateMaasProfileParams{}, body(name64, 16)); err != nil || r.StatusCode() != http.StatusCreated {
		t.Fatalf("64-character name, 16 SKUs: %v %d %s", err, r.StatusCode(), r.Body)
	}
	before := f.e.Count(t, `SELECT count(*) FROM maas_profiles`)
	for _, tc := range []struct {
		name string
		b    api.CreateMaasProfileJSONRequestBody
	}{
		{"65-character name", body(name64+"a", 1)},
		{"17 SKUs", body("p17", 17)},
		{"no SKU", body("p0", 0)},
	} {
		r, err := f.admin.CreateMaasProfileWithResponse(ctx, &api.CreateMaasProfileParams{}, tc.b)
		if err != nil || r.StatusCode() != http.StatusUnprocessableEntity || r.JSON422 == nil || r.JSON422.Code != api.ErrorCodeValidationError {
			t.Errorf("%s: %v %d %s", tc.name, err, r.StatusCode(), r.Body)
		}
	}
	if after := f.e.Count(t, `SELECT count(*) FROM maas_profiles`); after != before {
		t.Errorf("refused profiles were stored (%d -> %d)", before, after)
	}
	// Both system_id and constraints, or neither: 422.
	sys := "abc123"
	pool := "default"
	for _, b := range []api.CreateMaasOnboardingJSONRequestBody{
		{ProfileID: f.profile.ID},
		{ProfileID: f.profile.ID, SystemID: &sys, Constraints: &api.MaasMachineConstraints{Pool: &pool}},
	} {
		r, err := f.admin.CreateMaasOnboardingWithResponse(ctx, f.site.ID, &api.CreateMaasOnboardingParams{}, b)
		if err != nil || r.StatusCode() != http.StatusUnprocessableEntity {
			t.Errorf("onboarding %+v: %v %d %s", b, err, r.StatusCode(), r.Body)
		}
	}
	if n := f.e.Count(t, `SELECT count(*) FROM maas_onboardings`); n != 0 {
		t.Errorf("refused onboardings stored: %d", n)
	}
}

// An onboarding created twice with one Idempotency-Key is one onboarding.
func TestOnboardingIdempotencyKey(t *testing.T) {
	f := setup(t)
	sys := f.sim.AddMachine(maastest.MachineSpec{})
	key := "onboard-" + sys
	var ids []string
	for range 2 {
		r, err := f.admin.CreateMaasOnboardingWithResponse(context.Background(), f.site.ID, &api.CreateMaasOnboardingParams{IdempotencyKey: &key},
			api.CreateMaasOnboardingJSONRequestBody{ProfileID: f.profile.ID, SystemID: &sys})
		if err != nil || r.StatusCode() != http.StatusAccepted {
			t.Fatalf("onboard: %v %d %s", err, r.StatusCode(), r.Body)
		}
		ids = append(ids, r.JSON202.ID.String())
	}
	if ids[0] != ids[1] {
		t.Errorf("two onboardings for one key: %v", ids)
	}
	if n := f.e.Count(t, `SELECT count(*) FROM maas_onboardings`); n != 1 {
		t.Errorf("%d onboardings stored", n)
	}
}
