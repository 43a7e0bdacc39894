package catalog_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/catalog"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// LaunchSKU is what a launch reads: the active SKU and each of its regions with its
// state, in the SKU's order; no capacity, no prices (those come from billing's runway
// decision, tested there).
func TestLaunchSKU(t *testing.T) {
	e := env(t)
	ctx := context.Background()
	_, tok := e.PlatformAdmin(t)
	admin := e.Client(tok)
	createRegion(t, admin, "eu-west-1", "available", true)
	createRegion(t, admin, "us-east-1", "maintenance", false)
	createSKU(t, admin, h100SKU("h100-80gb-sxm.2x", 2, "us-east-1", "eu-west-1"))
	cat := catalog.New(e.Pool, e.App.Clock, e.App.IDs, catalog.BillingPrices{Billing: e.App.Billing, Clock: e.App.Clock}, nil)

	lt, err := cat.LaunchSKU(ctx, "h100-80gb-sxm.2x")
	if err != nil {
		t.Fatal(err)
	}
	if lt.SKU.ID != "h100-80gb-sxm.2x" || lt.SKU.GpuCount != 2 ||
		fmt.Sprint(lt.Regions) != "[{eu-west-1 available} {us-east-1 maintenance}]" {
		t.Fatalf("terms: %+v", lt)
	}

	// An inactive or unknown SKU is sku_not_found, as in the catalog.
	if r, err := admin.UpdateSkuWithResponse(ctx, "h100-80gb-sxm.2x", &api.UpdateSkuParams{},
		api.UpdateSkuJSONRequestBody{Active: ptr(false)}); err != nil || r.StatusCode() != 200 {
		t.Fatalf("deactivate: %v", err)
	}
	for _, id := range []string{"h100-80gb-sxm.2x", "nope.1x"} {
		_, err := cat.LaunchSKU(ctx, id)
		if e, ok := apierr.As(err); !ok || e.Code != apierr.SKUNotFound {
			t.Fatalf("%s: %v", id, err)
		}
	}
}
