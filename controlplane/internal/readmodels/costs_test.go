package readmodels_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/cockroachdb/apd/v3"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/readmodels"
)

// The cost projection of a running workload comes from the billing engine: accrued as
// billing.Accrued books it, runway exactly billing.RunwayAt's (what launch checks use),
// and the period cost projected at the quoted rate to the end of the month.
func TestWorkloadCostProjectionFromTheBillingEngine(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	_, padmin := e.PlatformAdmin(t)
	acme := e.NewTenant(t, padmin, "Acme")
	now := e.clk.Now()
	eff := now.Add(-48 * time.Hour)
	// 0.001 USD per GPU-second: 3.60 USD an hour.
	if _, err := e.App.Billing.CreatePlan(ctx, "test", true, &eff, []billing.PriceInput{{Unit: "gpu.h100", Currency: "USD", UnitPrice: "0.001"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.App.Billing.Adjust(ctx, billing.Adjustment{TenantID: acme.ID, Money: billing.Money{AmountMinor: 10_000, Currency: "USD"}, Reason: "test credit"}); err != nil {
		t.Fatal(err)
	}
	running := e.alloc(t, acme.ID, acme.DefaultProject, acme.AdminID, "running", "active", now.Add(-2*time.Hour), now.Add(-time.Hour))
	pending := e.alloc(t, acme.ID, acme.DefaultProject, acme.AdminID, "queued", "provisioning", now, now)
	if _, err := e.Pool.Exec(ctx, `UPDATE allocations SET hourly_rate_minor = 360, active_at = $2 WHERE id = $1`, running, now.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.App.Billing.StartUsage(ctx, nil, billing.UsageStart{Source: billing.SourceAllocation, SourceID: running, TenantID: acme.ID,
		ProjectID: acme.DefaultProject, UserID: acme.AdminID, Unit: "gpu.h100", Quantity: 1, Currency: "USD", StartedAt: now.Add(-time.Hour)}); err != nil {
		t.Fatal(err)
	}

	get := func(id string) map[string]any {
		t.Helper()
		a := e.Call(t, http.MethodGet, "/api/v1/v3/workloads/"+url.PathEscape(id), acme.AdminToken, nil, acme.DefaultProject.String())
		if a.Status != http.StatusOK {
			t.Fatalf("%d %s", a.Status, a.Raw)
		}
		return a.Body["workload"].(map[string]any)
	}
	w := get(readmodels.AllocationWorkloadID(running))
	cp := w["cost_projection"].(map[string]any)
	if cp["state"] != "accruing" || cp["runway_source"] != "balance" {
		t.Fatalf("running: %v", cp)
	}
	accrued := cp["accrued"].(map[string]any)["amount_minor"].(float64)
	if accrued != 360 || w["accrued_cost"].(map[string]any)["amount_minor"] != 360.0 {
		t.Fatalf("accrued after an hour at 3.60/h: %v / %v", cp["accrued"], w["accrued_cost"])
	}
	rw, err := e.App.Billing.RunwayAt(ctx, acme.ID, "USD", now)
	if err != nil {
		t.Fatal(err)
	}
	want := int64(rw.Duration(apd.New(0, 0)) / time.Second)
	if cp["runway_seconds"] != float64(want) || want != 96_400 { // (100.00 - 3.60) USD at 0.001 USD/s
		t.Fatalf("runway_seconds = %v, billing says %d", cp["runway_seconds"], want)
	}
	end := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC).AddDate(0, 1, 0)
	left := end.Sub(now).Milliseconds()
	proj := 360 + (360*left+3_599_999)/3_600_000
	if cp["projected_period_cost"].(map[string]any)["amount_minor"] != float64(proj) {
		t.Fatalf("projected = %v, want %d (period end %s)", cp["projected_period_cost"], proj, end)
	}
	if pe, _ := time.Parse(time.RFC3339, cp["period_end"].(string)); !pe.Equal(end) {
		t.Fatalf("period_end = %v, want %s", cp["period_end"], end)
	}

	cp = get(readmodels.AllocationWorkloadID(pending))["cost_projection"].(map[string]any)
	if cp["state"] != "pending" || cp["accrued"] != nil || cp["projected_period_cost"].(map[string]any)["amount_minor"] != 0.0 {
		t.Fatalf("never billed: %v", cp)
	}
	// Billing stops: the projection stops growing.
	if _, err := e.App.Billing.StopUsage(ctx, nil, billing.SourceAllocation, running, now); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(time.Hour)
	acme.AdminToken = e.Token(t, acme.AdminID)
	cp = get(readmodels.AllocationWorkloadID(running))["cost_projection"].(map[string]any)
	if cp["state"] != "stopped" || cp["projected_period_cost"].(map[string]any)["amount_minor"] != 360.0 || cp["runway_seconds"] != nil || cp["runway_source"] != "none" {
		t.Fatalf("stopped: %v", cp)
	}
}
