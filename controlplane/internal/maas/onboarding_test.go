package maas_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/maas/maastest"
	"github.com/gantry-gpu/gantry/proto/api"
)

type fixture struct {
	e       *apitest.Env
	stop    func() // stops the control plane's job runner
	sim     *maastest.Server
	admin   *api.ClientWithResponses
	site    api.MaasSite
	profile api.MaasProfile
}

// setup runs a control plane (with its River jobs) and a MAAS simulator with zero-length
// steps, and registers a site, a region, an H100 SKU, an OS image and a profile.
func setup(t *testing.T) *fixture { return setupWith(t, nil) }

// setupWith is setup with a simulator whose deployed machines boot with booter (nil: nothing).
func setupWith(t *testing.T, booter func(*apitest.Env) maastest.Booter) *fixture {
	return setupSim(t, booter, maastest.Durations{}, nil)
}

// setupSim is setupWith with step durations and the site's MAAS behind wrap (nil: direct).
func setupSim(t *testing.T, booter func(*apitest.Env) maastest.Booter, durs maastest.Durations, wrap func(http.Handler) http.Handler) *fixture {
	t.Helper()
	return newFixture(t, fixtureOpts{booter: booter, durs: durs, wrap: wrap, runJobs: true})
}

type fixtureOpts struct {
	booter func(*apitest.Env) maastest.Booter
	durs   maastest.Durations
	wrap   func(http.Handler) http.Handler
	// runJobs runs the job runner in the test process; without it the steps run only
	// in a replica the test starts (sigkill_test.go).
	runJobs bool
	// config edits the control plane's configuration after the fixture's own settings.
	config func(*app.Config)
}

func newFixture(t *testing.T, fo fixtureOpts) *fixture {
	t.Helper()
	booter, durs, wrap := fo.booter, fo.durs, fo.wrap
	e := apitest.New(t, apitest.WithConfig(func(c *app.Config) {
		c.Maas.PollInterval = 20 * time.Millisecond
		c.Maas.ControlPlaneURL = "http://127.0.0.1:1"
		if fo.config != nil {
			fo.config(c)
		}
	}), apitest.WithOptions(func(o *app.Options) { o.NodeProbeDialer = okDialer{} }))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	if fo.runJobs {
		go func() { defer close(done); _ = e.App.Jobs.Run(ctx) }()
	} else {
		close(done)
	}
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	cfg := maastest.Config{Durations: durs}
	if booter != nil {
		cfg.Booter = booter(e)
	}
	sim := maastest.New(cfg)
	sim.Start(false)
	t.Cleanup(sim.Close)
	siteURL := sim.URL()
	if wrap != nil {
		front := httptest.NewServer(wrap(sim.Handler()))
		t.Cleanup(front.Close)
		siteURL = front.URL + "/MAAS"
	}
	_, tok := e.PlatformAdmin(t)
	c := e.Client(tok)
	bg := context.Background()
	state := api.V3RegionAvailabilityStateAvailable
	if r, err := c.CreateRegionWithResponse(bg, &api.CreateRegionParams{}, api.CreateRegionJSONRequestBody{Code: "rack-a", Label: "Rack A", AvailabilityState: &state}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("region: %v %s", err, r.Body)
	}
	if r, err := c.CreateSkuWithResponse(bg, &api.CreateSkuParams{}, api.CreateSkuJSONRequestBody{ID: "h100-80gb.8x", GpuModel: "NVIDIA H100 80GB HBM3",
		GpuCount: 8, Vcpu: 64, MemoryGib: 512, DiskGib: 2000, UsageUnit: "gpu_second.h100", Regions: []string{"rack-a"}}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("sku: %v %s", err, r.Body)
	}
	img, err := c.CreateOsImageWithResponse(bg, &api.CreateOsImageParams{}, api.CreateOsImageJSONRequestBody{Name: "ubuntu-24-04", Distribution: "ubuntu", Version: "24.04", ImageRef: "ubuntu/noble"})
	if err != nil || img.StatusCode() != 201 {
		t.Fatalf("image: %v %s", err, img.Body)
	}
	f := &fixture{e: e, sim: sim, admin: c, stop: stop}
	// A wrong key: 502 upstream_error naming the refusal, nothing stored.
	bad, err := c.CreateMaasSiteWithResponse(bg, &api.CreateMaasSiteParams{}, api.CreateMaasSiteJSONRequestBody{Name: "dc1", Region: "rack-a",
		APIURL: sim.URL(), APIKey: "wrong:wrong:wrong"})
	if err != nil || bad.StatusCode() != http.StatusBadGateway || bad.JSON502 == nil || bad.JSON502.Code != api.ErrorCodeUpstreamError {
		t.Fatalf("wrong key: %v %d %s", err, bad.StatusCode(), bad.Body)
	}
	if n := e.Count(t, `SELECT count(*) FROM maas_sites`); n != 0 {
		t.Fatalf("a refused site was stored (%d rows)", n)
	}
	site, err := c.CreateMaasSiteWithResponse(bg, &api.CreateMaasSiteParams{}, api.CreateMaasSiteJSONRequestBody{Name: "dc1", Region: "rack-a",
		APIURL: siteURL, APIKey: sim.APIKey()})
	if err != nil || site.StatusCode() != 201 {
		t.Fatalf("site: %v %s", err, site.Body)
	}
	f.site = *site.JSON201
	prof, err := c.CreateMaasProfileWithResponse(bg, &api.CreateMaasProfileParams{}, api.CreateMaasProfileJSONRequestBody{Name: "h100-nodes",
		OsImageID: img.JSON201.ID, Skus: []string{"h100-80gb.8x"}})
	if err != nil || prof.StatusCode() != 201 {
		t.Fatalf("profile: %v %s", err, prof.Body)
	}
	if prof.JSON201.DistroSeries != "noble" || prof.JSON201.Osystem != "ubuntu" {
		t.Fatalf("profile maps the image to %s/%s, want ubuntu/noble", prof.JSON201.Osystem, prof.JSON201.DistroSeries)
	}
	f.profile = *prof.JSON201
	return f
}

func (f *fixture) onboard(t *testing.T, systemID string) *api.CreateMaasOnboardingHTTPResponse {
	t.Helper()
	r, err := f.admin.CreateMaasOnboardingWithResponse(context.Background(), f.site.ID, &api.CreateMaasOnboardingParams{},
		api.CreateMaasOnboardingJSONRequestBody{ProfileID: f.profile.ID, SystemID: &systemID})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// waitFor polls the onboarding until cond holds (bounded by the test's deadline).
func (f *fixture) waitFor(t *testing.T, id api.MaasOnboarding, cond func(api.MaasOnboarding) bool) api.MaasOnboarding {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		r, err := f.admin.GetMaasOnboardingWithResponse(context.Background(), id.ID, &api.GetMaasOnboardingParams{})
		if err != nil || r.JSON200 == nil {
			t.Fatalf("get onboarding: %v", err)
		}
		if cond(*r.JSON200) {
			return *r.JSON200
		}
		if time.Now().After(deadline) {
			t.Fatalf("onboarding stuck: state %s step %v reason %v steps %s", r.JSON200.State, deref(r.JSON200.CurrentStep), deref(r.JSON200.FailureReason), stepsText(r.JSON200.Steps))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func atStep(step string) func(api.MaasOnboarding) bool {
	return func(o api.MaasOnboarding) bool { return o.CurrentStep != nil && *o.CurrentStep == step }
}

// deploys counts the deploy calls MAAS received for the machine.
func deploys(sim *maastest.Server, systemID string) int {
	n := 0
	for _, c := range sim.Calls() {
		if c.Op == "deploy" && c.SystemID == systemID { // attempts, refused ones too
			n++
		}
	}
	return n
}

// A Ready machine goes allocate -> create_node -> deploy -> wait_deployed and waits for
// its agent; a New one is commissioned first. Each is deployed exactly once, the node
// record exists once and stays cordoned until the agent reports the SKU's GPUs.
func TestOnboardingReachesEnrollment(t *testing.T) {
	f := setup(t)
	ready := f.sim.AddMachine(maastest.MachineSpec{})
	fresh := f.sim.AddMachine(maastest.MachineSpec{New: true})

	sync, err := f.admin.SyncMaasSiteWithResponse(context.Background(), f.site.ID, &api.SyncMaasSiteParams{})
	if err != nil || sync.JSON200 == nil || sync.JSON200.MachineCount != 2 || sync.JSON200.Added != 2 {
		t.Fatalf("sync: %v %s", err, sync.Body)
	}
	ms, err := f.admin.ListMaasMachinesWithResponse(context.Background(), f.site.ID, &api.ListMaasMachinesParams{})
	if err != nil || ms.JSON200 == nil {
		t.Fatalf("machines: %v", err)
	}
	for _, m := range ms.JSON200.Items {
		want := 0
		if m.SystemID == ready {
			want = 1 // commissioned: its 8 H100s make h100x8
		}
		if len(m.SkuCandidates) != want {
			t.Errorf("machine %s (%s): candidates %v, want %d", m.SystemID, m.StatusName, m.SkuCandidates, want)
		}
	}

	for _, sys := range []string{ready, fresh} {
		r := f.onboard(t, sys)
		if r.StatusCode() != http.StatusAccepted {
			t.Fatalf("onboard %s: %d %s", sys, r.StatusCode(), r.Body)
		}
		o := f.waitFor(t, *r.JSON202, atStep("wait_enrolled"))
		if o.NodeID == nil {
			t.Fatalf("no node after create_node: %+v", o)
		}
		if got := deploys(f.sim, sys); got != 1 {
			t.Errorf("%s deployed %d times, want 1", sys, got)
		}
		commission := o.Steps[1]
		if sys == ready && commission.State != api.MaasWorkflowStepStateSkipped {
			t.Errorf("ready machine: commission %s, want skipped", commission.State)
		}
		if sys == fresh && commission.State != api.MaasWorkflowStepStateSucceeded {
			t.Errorf("new machine: commission %s, want succeeded", commission.State)
		}
		for _, s := range o.Steps[:5] {
			if s.StartedAt == nil && s.State != api.MaasWorkflowStepStateSkipped {
				t.Errorf("step %s has no start time", s.Name)
			}
		}
		if n := f.e.Count(t, `SELECT count(*) FROM nodes WHERE id = $1 AND schedule_state = 'cordoned'`, *o.NodeID); n != 1 {
			t.Errorf("node %s is not one cordoned record", *o.NodeID)
		}
		if n := f.e.Count(t, `SELECT count(*) FROM audit_events WHERE target_id = $1 AND action = 'maas.onboarding.step'`, o.ID.String()); n < 4 {
			t.Errorf("only %d audited step changes", n)
		}
	}
	// The machine is taken: onboarding it again is 409.
	if r := f.onboard(t, ready); r.StatusCode() != http.StatusConflict {
		t.Errorf("second onboarding of a deployed machine: %d %s", r.StatusCode(), r.Body)
	}
}

// Of concurrent onboardings of one machine exactly one is accepted.
func TestConcurrentOnboardingsOneWins(t *testing.T) {
	f := setup(t)
	sys := f.sim.AddMachine(maastest.MachineSpec{})
	const n = 8
	codes := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); codes[i] = f.onboard(t, sys).StatusCode() }()
	}
	wg.Wait()
	won := 0
	for _, c := range codes {
		switch c {
		case http.StatusAccepted:
			won++
		case http.StatusConflict:
		default:
			t.Errorf("unexpected status %d", c)
		}
	}
	if won != 1 {
		t.Fatalf("%d onboardings accepted, want exactly 1 (%v)", won, codes)
	}
}

// A FailedDeployment leaves the onboarding failed with the reason; retry releases,
// re-allocates and deploys again, and the workflow moves on.
func TestFailedDeploymentRetry(t *testing.T) {
	f := setup(t)
	sys := f.sim.AddMachine(maastest.MachineSpec{})
	f.sim.Inject(sys, maastest.FailDeployment)
	r := f.onboard(t, sys)
	if r.StatusCode() != http.StatusAccepted {
		t.Fatalf("onboard: %d %s", r.StatusCode(), r.Body)
	}
	o := f.waitFor(t, *r.JSON202, func(o api.MaasOnboarding) bool { return o.State == api.MaasWorkflowStateFailed })
	if o.FailureReason == nil || deref(o.CurrentStep) != "wait_deployed" {
		t.Fatalf("failed at %s with %v, want wait_deployed with a reason", deref(o.CurrentStep), o.FailureReason)
	}
	rr, err := f.admin.RetryMaasOnboardingWithResponse(context.Background(), o.ID, &api.RetryMaasOnboardingParams{})
	if err != nil || rr.StatusCode() != http.StatusAccepted {
		t.Fatalf("retry: %v %s", err, rr.Body)
	}
	f.waitFor(t, o, atStep("wait_enrolled"))
	if got := deploys(f.sim, sys); got != 2 {
		t.Errorf("deploy calls %d, want 2 (the failed one and the retry)", got)
	}
	// Retrying what is not failed is 409.
	if rr, _ := f.admin.RetryMaasOnboardingWithResponse(context.Background(), o.ID, &api.RetryMaasOnboardingParams{}); rr.StatusCode() != http.StatusConflict {
		t.Errorf("retry of a running onboarding: %d", rr.StatusCode())
	}
}

func stepsText(steps []api.MaasWorkflowStep) string {
	var b strings.Builder
	for _, s := range steps {
		fmt.Fprintf(&b, "[%s %s #%d %q] ", s.Name, s.State, s.Attempts, deref(s.Reason))
	}
	return b.String()
}

// With constraints MAAS chooses the machine; the onboarding records it and carries on.
func TestOnboardingByConstraints(t *testing.T) {
	f := setup(t)
	f.sim.AddMachine(maastest.MachineSpec{Tags: []string{"spare"}})
	tagged := f.sim.AddMachine(maastest.MachineSpec{Tags: []string{"h100", "rack-a"}})
	r, err := f.admin.CreateMaasOnboardingWithResponse(context.Background(), f.site.ID, &api.CreateMaasOnboardingParams{},
		api.CreateMaasOnboardingJSONRequestBody{ProfileID: f.profile.ID, Constraints: &api.MaasMachineConstraints{Tags: []string{"h100"}}})
	if err != nil || r.StatusCode() != http.StatusAccepted {
		t.Fatalf("onboard: %v %s", err, r.Body)
	}
	o := f.waitFor(t, *r.JSON202, atStep("wait_enrolled"))
	if deref(o.SystemID) != tagged {
		t.Fatalf("MAAS chose %s, want the tagged %s", deref(o.SystemID), tagged)
	}
	if o.Steps[1].State != api.MaasWorkflowStepStateSkipped {
		t.Errorf("commission: %s", o.Steps[1].State)
	}
	// Nothing else matches now: a second one fails at allocate with the reason.
	r, err = f.admin.CreateMaasOnboardingWithResponse(context.Background(), f.site.ID, &api.CreateMaasOnboardingParams{},
		api.CreateMaasOnboardingJSONRequestBody{ProfileID: f.profile.ID, Constraints: &api.MaasMachineConstraints{Tags: []string{"h100"}}})
	if err != nil || r.StatusCode() != http.StatusAccepted {
		t.Fatalf("onboard: %v %s", err, r.Body)
	}
	o = f.waitFor(t, *r.JSON202, func(o api.MaasOnboarding) bool { return o.State == api.MaasWorkflowStateFailed })
	if deref(o.CurrentStep) != "allocate" || !strings.Contains(deref(o.FailureReason), "no machine") {
		t.Errorf("failed at %s: %s", deref(o.CurrentStep), deref(o.FailureReason))
	}
}
