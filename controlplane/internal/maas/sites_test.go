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

// A rotated-in key MAAS refuses stays pending while the old one keeps working; once MAAS
// accepts it, the next use makes it active and retires the old key, which MAAS may then
// revoke. No answer ever carries a key.
func TestCredentialRotation(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	oldKey := f.sim.APIKey()
	newKey := maastest.NewAPIKey()

	r, err := f.admin.RotateMaasSiteCredentialWithResponse(ctx, f.site.ID, &api.RotateMaasSiteCredentialParams{}, api.RotateMaasSiteCredentialJSONRequestBody{APIKey: newKey})
	if err != nil || r.StatusCode() != http.StatusCreated {
		t.Fatalf("rotate: %v %s", err, r.Body)
	}
	if r.JSON201.State != api.MaasCredentialStatePending {
		t.Fatalf("a key MAAS does not know is %s, want pending", r.JSON201.State)
	}
	pending := r.JSON201.CredentialID
	for _, key := range []string{oldKey, newKey} {
		secret := key[strings.LastIndex(key, ":")+1:]
		if strings.Contains(string(r.Body), secret) {
			t.Fatal("the rotation answer carries a key")
		}
	}
	// The site still works on the old key.
	if s, err := f.admin.SyncMaasSiteWithResponse(ctx, f.site.ID, &api.SyncMaasSiteParams{}); err != nil || s.StatusCode() != 200 {
		t.Fatalf("sync on the old key: %v %s", err, s.Body)
	}
	g, _ := f.admin.GetMaasSiteWithResponse(ctx, f.site.ID, &api.GetMaasSiteParams{})
	if g.JSON200.CredentialID != f.site.CredentialID || g.JSON200.PendingCredentialID == nil || *g.JSON200.PendingCredentialID != pending {
		t.Fatalf("site after a refused rotation: active %s pending %v", g.JSON200.CredentialID, g.JSON200.PendingCredentialID)
	}

	// MAAS learns the new key: the next check uses it, promotes it, retires the old one.
	if err := f.sim.AddAPIKey(newKey); err != nil {
		t.Fatal(err)
	}
	check := true
	g, err = f.admin.GetMaasSiteWithResponse(ctx, f.site.ID, &api.GetMaasSiteParams{Check: &check})
	if err != nil || g.JSON200 == nil {
		t.Fatalf("check: %v", err)
	}
	if g.JSON200.CredentialID != pending || g.JSON200.PendingCredentialID != nil || g.JSON200.LastCheck == nil || g.JSON200.LastCheck.Status != api.MaasSiteCheckStatusOk {
		t.Fatalf("after MAAS accepted it: active %s pending %v check %+v", g.JSON200.CredentialID, g.JSON200.PendingCredentialID, g.JSON200.LastCheck)
	}
	if n := f.e.Count(t, `SELECT count(*) FROM maas_credentials WHERE id = $1 AND state = 'retired'`, f.site.CredentialID); n != 1 {
		t.Error("old credential not retired")
	}
	// The old key can now be revoked in MAAS without breaking the site.
	f.sim.RevokeAPIKey(oldKey)
	if s, err := f.admin.SyncMaasSiteWithResponse(ctx, f.site.ID, &api.SyncMaasSiteParams{}); err != nil || s.StatusCode() != 200 {
		t.Fatalf("sync on the new key: %v %s", err, s.Body)
	}
	// Keys are sealed at rest: the plaintext is nowhere in the table.
	secret := newKey[strings.LastIndex(newKey, ":")+1:]
	if n := f.e.Count(t, `SELECT count(*) FROM maas_credentials WHERE position($1::bytea in key_sealed) > 0`, []byte(secret)); n != 0 {
		t.Error("an API key is stored in the clear")
	}
	// With every key revoked the check reports credentials_invalid (200, recorded).
	f.sim.RevokeAPIKey(newKey)
	g, err = f.admin.GetMaasSiteWithResponse(ctx, f.site.ID, &api.GetMaasSiteParams{Check: &check})
	if err != nil || g.JSON200 == nil || g.JSON200.LastCheck.Status != api.MaasSiteCheckStatusCredentialsInvalid {
		t.Fatalf("check with a revoked key: %v %s", err, g.Body)
	}
	if s, _ := f.admin.SyncMaasSiteWithResponse(ctx, f.site.ID, &api.SyncMaasSiteParams{}); s.StatusCode() != http.StatusBadGateway || s.JSON502.Code != api.ErrorCodeUpstreamError ||
		strings.Contains(string(s.Body), "Invalid access token") {
		t.Fatalf("sync with a revoked key: %d %s", s.StatusCode(), s.Body)
	}
}

// An unreachable MAAS is a 502 upstream_error naming it; nothing is stored.
func TestUnreachableSite(t *testing.T) {
	f := setup(t)
	r, err := f.admin.CreateMaasSiteWithResponse(context.Background(), &api.CreateMaasSiteParams{}, api.CreateMaasSiteJSONRequestBody{Name: "dc2", Region: "rack-a",
		APIURL: "http://127.0.0.1:1/MAAS", APIKey: "a:b:c"})
	if err != nil || r.StatusCode() != http.StatusBadGateway || !strings.Contains(string(r.Body), "maas_unreachable") {
		t.Fatalf("unreachable: %v %d %s", err, r.StatusCode(), r.Body)
	}
	if n := f.e.Count(t, `SELECT count(*) FROM maas_sites WHERE name = 'dc2'`); n != 0 {
		t.Fatal("an unreachable site was stored")
	}
}

// Abort stops an onboarding mid-deploy, releases the machine in MAAS and removes the node.
func TestAbortReleasesMachine(t *testing.T) {
	f := setupSim(t, nil, maastest.Durations{Deploying: time.Hour}, nil)
	sys := f.sim.AddMachine(maastest.MachineSpec{})
	r := f.onboard(t, sys)
	o := f.waitFor(t, *r.JSON202, atStep("wait_deployed"))
	a, err := f.admin.AbortMaasOnboardingWithResponse(context.Background(), o.ID, &api.AbortMaasOnboardingParams{})
	if err != nil || a.StatusCode() != http.StatusAccepted {
		t.Fatalf("abort: %v %s", err, a.Body)
	}
	o = f.waitFor(t, o, func(o api.MaasOnboarding) bool { return o.State == api.MaasWorkflowStateAborted })
	if m, _ := f.sim.Machine(sys); m.Status != maastest.StatusReady {
		t.Errorf("machine after abort: %s", m.Status)
	}
	if n := f.e.Count(t, `SELECT count(*) FROM nodes`); n != 0 {
		t.Errorf("%d node records left after abort", n)
	}
	if a, _ := f.admin.AbortMaasOnboardingWithResponse(context.Background(), o.ID, &api.AbortMaasOnboardingParams{}); a.StatusCode() != http.StatusConflict {
		t.Errorf("abort of an aborted onboarding: %d", a.StatusCode())
	}
	// The machine can be onboarded again.
	if r := f.onboard(t, sys); r.StatusCode() != http.StatusAccepted {
		t.Errorf("onboard after abort: %d %s", r.StatusCode(), r.Body)
	}
}
