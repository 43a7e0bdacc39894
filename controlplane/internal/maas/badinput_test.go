package maas_test

import (
	"context"
	"encoding/pem"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	"github.com/gantry-gpu/gantry/controlplane/internal/maas/maastest"
	"github.com/gantry-gpu/gantry/proto/api"
)

// A MAAS behind a certificate the system does not trust is 502 maas_tls_invalid; with its
// CA as the site's ca_bundle it registers, and tls_verify=false accepts it too.
func TestSiteTLS(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	tlsSim := maastest.New(maastest.Config{})
	tlsSim.Start(true)
	t.Cleanup(tlsSim.Close)
	body := api.CreateMaasSiteJSONRequestBody{Name: "tls", Region: "rack-a", APIURL: tlsSim.URL(), APIKey: tlsSim.APIKey()}
	r, err := f.admin.CreateMaasSiteWithResponse(ctx, &api.CreateMaasSiteParams{}, body)
	if err != nil || r.StatusCode() != http.StatusBadGateway || !strings.Contains(string(r.Body), "maas_tls_invalid") {
		t.Fatalf("untrusted certificate: %v %d %s", err, r.StatusCode(), r.Body)
	}
	ca := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsSim.TLSServer().Certificate().Raw}))
	body.CaBundle = &ca
	if r, err := f.admin.CreateMaasSiteWithResponse(ctx, &api.CreateMaasSiteParams{}, body); err != nil || r.StatusCode() != http.StatusCreated {
		t.Fatalf("with the CA bundle: %v %d %s", err, r.StatusCode(), r.Body)
	}
	off := false
	if r, err := f.admin.CreateMaasSiteWithResponse(ctx, &api.CreateMaasSiteParams{}, api.CreateMaasSiteJSONRequestBody{Name: "tls-off", Region: "rack-a",
		APIURL: tlsSim.URL(), APIKey: tlsSim.APIKey(), TLSVerify: &off}); err != nil || r.StatusCode() != http.StatusCreated {
		t.Fatalf("tls_verify=false: %v %d %s", err, r.StatusCode(), r.Body)
	}
}

// A machine whose commissioned GPUs make none of the profile's SKUs is refused up front
// (422 sku_mismatch); one whose agent reports other GPUs than expected fails at
// wait_enrolled with the mismatch named.
func TestGPUMismatch(t *testing.T) {
	shortBooter := func(e *apitest.Env) maastest.Booter {
		return maastest.BooterFunc(func(ctx context.Context, req maastest.BootRequest) (maastest.Instance, string, error) {
			enr, err := e.App.Nodes.Enroll(ctx, tokenRE.FindString(string(req.UserData)), req.Hostname, "1.0.0")
			if err != nil {
				return nil, "", err
			}
			inv := fleet.Inventory{AgentVersion: "1.0.0", Hostname: req.Hostname}
			for i := range 4 { // half the GPUs MAAS saw
				inv.GPUs = append(inv.GPUs, fleet.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", req.SystemID, i), Model: "NVIDIA H100 80GB HBM3",
					MemoryBytes: 80 << 30, PCIBusID: fmt.Sprintf("0000:%02x:00.0", i)})
			}
			if err := e.App.Nodes.NodeConnected(ctx, enr.NodeID, inv, time.Now()); err != nil {
				return nil, "", err
			}
			return nil, "", e.App.Nodes.NodeStatus(ctx, enr.NodeID, true, time.Now())
		})
	}
	f := setupWith(t, shortBooter)
	a100 := f.sim.AddMachine(maastest.MachineSpec{GPU: "mock-a100"})
	r := f.onboard(t, a100)
	if r.StatusCode() != http.StatusUnprocessableEntity || !strings.Contains(string(r.Body), "sku_mismatch") {
		t.Fatalf("A100 machine for an H100 profile: %d %s", r.StatusCode(), r.Body)
	}
	if n := f.e.Count(t, `SELECT count(*) FROM maas_onboardings`); n != 0 {
		t.Fatal("a refused onboarding was stored")
	}
	h100 := f.sim.AddMachine(maastest.MachineSpec{})
	r = f.onboard(t, h100)
	if r.StatusCode() != http.StatusAccepted {
		t.Fatalf("onboard: %d %s", r.StatusCode(), r.Body)
	}
	o := f.waitFor(t, *r.JSON202, func(o api.MaasOnboarding) bool { return o.State == api.MaasWorkflowStateFailed })
	if deref(o.CurrentStep) != "wait_enrolled" || !strings.Contains(deref(o.FailureReason), "GPU mismatch") {
		t.Fatalf("failed at %s: %s", deref(o.CurrentStep), deref(o.FailureReason))
	}
}

// The node agent package is public; without a configured package it is 503
// service_unavailable.
func TestNodeAgentPackageUnconfigured(t *testing.T) {
	f := setup(t)
	a := f.e.Call(t, http.MethodGet, "/api/v1/node-agent/package", "", nil, "")
	if a.Status != http.StatusServiceUnavailable || a.Body["code"] != "service_unavailable" {
		t.Fatalf("package without configuration: %d %s", a.Status, a.Raw)
	}
}
