package catalog_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/catalog"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// LaunchTerms is what a launch reads: the active SKU, the tenant's prices with hourly
// rates, and each of the SKU's regions with its state, in the SKU's order; no capacity.
func TestLaunchTerms(t *testing.T) {
	e := env(t)
	ctx := context.Background()
	_, tok := e.PlatformAdmin(t)
	admin := e.Client(tok)
	createRegion(t, admin, "eu-west-1", "available", true)
	createRegion(t, admin, "us-east-1", "maintenance", false)
	createSKU(t, admin, h100SKU("h100-80gb-sxm.2x", 2, "us-east-1", "eu-west-1"))
	tenant := e.NewTenant(t, tok, "Acme")
	cat := catalog.New(e.Pool, e.App.Clock, e.App.IDs, catalog.BillingPrices{Billing: e.App.Billing, Clock: e.App.Clock}, nil)

	lt, err := cat.LaunchTerms(ctx, tenant.ID, "h100-80gb-sxm.2x")
	if err != nil {
		t.Fatal(err)
	}
	if lt.SKU.ID != "h100-80gb-sxm.2x" || lt.SKU.GpuCount != 2 || len(lt.Prices) != 0 ||
		fmt.Sprint(lt.Regions) != "[{eu-west-1 available} {us-east-1 maintenance}]" {
		t.Fatalf("terms without a plan: %+v", lt)
	}

	def, err := e.App.Billing.CreatePlan(ctx, "list", true, nil, []billing.PriceInput{
		{Unit: "gpu_second.h100-80gb-sxm", Currency: "USD", UnitPrice: "0.000694"},
		{Unit: "gpu_second.h100-80gb-sxm", Currency: "EUR", UnitPrice: "0.0006"},
		{Unit: "gpu_second.a100-80gb-sxm", Currency: "USD", UnitPrice: "0.0004"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if lt, err = cat.LaunchTerms(ctx, tenant.ID, "h100-80gb-sxm.2x"); err != nil {
		t.Fatal(err)
	}
	// 2 GPUs x 3600 s: EUR 0.0006 -> 432 cents; USD 0.000694 -> 4.9968 -> 500 cents.
	if len(lt.Prices) != 2 || lt.Prices[0].Currency != "EUR" || lt.Prices[0].HourlyMinor != 432 ||
		lt.Prices[1].Currency != "USD" || lt.Prices[1].HourlyMinor != 500 || lt.Prices[1].PlanID != def.ID {
		t.Fatalf("prices: %+v", lt.Prices)
	}

	// An inactive or unknown SKU is sku_not_found, as in the catalog.
	if r, err := admin.UpdateSkuWithResponse(ctx, "h100-80gb-sxm.2x", &api.UpdateSkuParams{},
		api.UpdateSkuJSONRequestBody{Active: ptr(false)}); err != nil || r.StatusCode() != 200 {
		t.Fatalf("deactivate: %v", err)
	}
	for _, id := range []string{"h100-80gb-sxm.2x", "nope.1x"} {
		_, err := cat.LaunchTerms(ctx, tenant.ID, id)
		if e, ok := apierr.As(err); !ok || e.Code != apierr.SKUNotFound {
			t.Fatalf("%s: %v", id, err)
		}
	}
}
