package catalog_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/catalog"
	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/proto/api"
)

const h100 = "NVIDIA H100 80GB HBM3"

var nodeSeq atomic.Int32

// node creates a node in region with gpus GPUs of model, connected and online unless
// told otherwise, through node administration's Go API and the fabric's Directory calls.
func node(t *testing.T, e *apitest.Env, name, region, model string, gpus int, online bool) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	spec := nodes.Spec{Name: name, Address: fmt.Sprintf("10.9.0.%d", nodeSeq.Add(1))}
	if region != "" {
		spec.Region = &region
	}
	n, err := e.App.Nodes.Create(ctx, spec)
	if err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	inv := fleet.Inventory{AgentVersion: "1.0.0", Hostname: name}
	for i := 0; i < gpus; i++ {
		inv.GPUs = append(inv.GPUs, fleet.GPU{
			Index: i, UUID: fmt.Sprintf("GPU-%s-%d", name, i), Model: model, MemoryBytes: 81920 << 20,
			PCIBusID: fmt.Sprintf("0000:%02x:00.0", i), DriverVersion: "550.54.15", CUDAVersion: "12.4",
		})
	}
	if err := e.App.Nodes.NodeConnected(ctx, n.ID, inv, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := e.App.Nodes.NodeStatus(ctx, n.ID, online, time.Now()); err != nil {
		t.Fatal(err)
	}
	return n.ID
}

func getOffer(t *testing.T, c *api.ClientWithResponses, id string) api.CatalogSKU {
	t.Helper()
	r, err := c.GetCatalogSkuWithResponse(context.Background(), id, &api.GetCatalogSkuParams{})
	if err != nil || r.StatusCode() != 200 {
		t.Fatalf("catalog sku %s: %v %s", id, err, r.Body)
	}
	return *r.JSON200
}

func availability(o api.CatalogSKU, region string) api.CatalogSKUAvailability {
	for _, a := range o.Availability {
		if a.RegionCode == region {
			return a
		}
	}
	return api.CatalogSKUAvailability{RegionCode: "missing"}
}

func TestCatalogAvailabilityFromTheFleet(t *testing.T) {
	e := env(t)
	ctx := context.Background()
	_, tok := e.PlatformAdmin(t)
	admin := e.Client(tok)
	createRegion(t, admin, "eu-west-1", "available", true)
	createRegion(t, admin, "us-east-1", "maintenance", false)
	createRegion(t, admin, "ap-south-1", "available", false)
	createSKU(t, admin, h100SKU("h100-80gb-sxm.2x", 2, "eu-west-1", "us-east-1", "ap-south-1"))

	// Nothing in the fleet yet.
	o := getOffer(t, admin, "h100-80gb-sxm.2x")
	if len(o.Availability) != 3 || availability(o, "eu-west-1").Available || availability(o, "eu-west-1").FreeGpus != 0 {
		t.Fatalf("empty fleet: %+v", o.Availability)
	}

	node(t, e, "eu-a", "eu-west-1", h100, 8, true)    // 8 free: fits 4
	node(t, e, "eu-b", "eu-west-1", h100, 3, true)    // 3 free: fits 1
	node(t, e, "eu-off", "eu-west-1", h100, 8, false) // offline: nothing
	cordoned := node(t, e, "eu-cord", "eu-west-1", h100, 8, true)
	if _, err := e.App.Nodes.ChangeSchedule(ctx, cordoned, nodes.ActionCordon); err != nil {
		t.Fatal(err)
	}
	sick := node(t, e, "eu-sick", "eu-west-1", h100, 2, true) // one GPU unhealthy: 1 free, fits 0
	if err := e.App.Nodes.NodeTelemetry(ctx, sick, []fleet.GPUMetrics{
		{UUID: "GPU-eu-sick-0", Healthy: false, SampledAt: time.Now()},
		{UUID: "GPU-eu-sick-1", Healthy: true, SampledAt: time.Now()},
	}); err != nil {
		t.Fatal(err)
	}
	node(t, e, "eu-a100", "eu-west-1", "NVIDIA A100-SXM4-80GB", 8, true) // another model
	node(t, e, "us-a", "us-east-1", h100, 8, true)                       // region in maintenance
	node(t, e, "nowhere", "", h100, 8, true)                             // no region: no region's capacity

	o = getOffer(t, admin, "h100-80gb-sxm.2x")
	want := map[string]api.CatalogSKUAvailability{
		"eu-west-1":  {RegionCode: "eu-west-1", RegionState: "available", FreeGpus: 12, AvailableCount: 5, Available: true},
		"us-east-1":  {RegionCode: "us-east-1", RegionState: "maintenance", FreeGpus: 8, AvailableCount: 0, Available: false},
		"ap-south-1": {RegionCode: "ap-south-1", RegionState: "available", FreeGpus: 0, AvailableCount: 0, Available: false},
	}
	for region, w := range want {
		if got := availability(o, region); got != w {
			t.Errorf("%s: got %+v, want %+v", region, got, w)
		}
	}

	// The region opens: its capacity shows. The list answers the same as the item.
	if r, err := admin.UpdateRegionWithResponse(ctx, "us-east-1", &api.UpdateRegionParams{},
		api.UpdateRegionJSONRequestBody{AvailabilityState: ptr(api.V3RegionAvailabilityState("available"))}); err != nil || r.StatusCode() != 200 {
		t.Fatalf("open region: %v", err)
	}
	l, err := admin.ListCatalogSkusWithResponse(ctx, &api.ListCatalogSkusParams{})
	if err != nil || l.StatusCode() != 200 || len(l.JSON200.Items) != 1 {
		t.Fatalf("list: %v %s", err, l.Body)
	}
	if a := availability(l.JSON200.Items[0], "us-east-1"); a.AvailableCount != 4 || !a.Available {
		t.Fatalf("us-east-1 after opening: %+v", a)
	}

	// An inactive SKU leaves the catalog.
	if r, err := admin.UpdateSkuWithResponse(ctx, "h100-80gb-sxm.2x", &api.UpdateSkuParams{},
		api.UpdateSkuJSONRequestBody{Active: ptr(false)}); err != nil || r.StatusCode() != 200 {
		t.Fatalf("deactivate: %v", err)
	}
	g, err := admin.GetCatalogSkuWithResponse(ctx, "h100-80gb-sxm.2x", &api.GetCatalogSkuParams{})
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, g.Body, g.StatusCode(), 404, "sku_not_found", "")
	l, err = admin.ListCatalogSkusWithResponse(ctx, &api.ListCatalogSkusParams{})
	if err != nil || len(l.JSON200.Items) != 0 {
		t.Fatalf("list after deactivate: %v %s", err, l.Body)
	}
}

func TestCatalogPrices(t *testing.T) {
	e := env(t)
	ctx := context.Background()
	_, tok := e.PlatformAdmin(t)
	admin := e.Client(tok)
	createRegion(t, admin, "eu-west-1", "available", true)
	createSKU(t, admin, h100SKU("h100-80gb-sxm.2x", 2, "eu-west-1"))
	tenant := e.NewTenant(t, tok, "Acme")
	_, memberTok := e.NewUser(t, tenant.AdminToken, "member")
	member := e.Client(memberTok)

	// No pricing plan: no prices, still listed.
	if o := getOffer(t, member, "h100-80gb-sxm.2x"); len(o.Prices) != 0 {
		t.Fatalf("prices without a plan: %+v", o.Prices)
	}

	def, err := e.App.Billing.CreatePlan(ctx, "list", true, nil, []billing.PriceInput{
		{Unit: "gpu_second.h100-80gb-sxm", Currency: "USD", UnitPrice: "0.000694"},
		{Unit: "gpu_second.h100-80gb-sxm", Currency: "EUR", UnitPrice: "0.0006"},
		{Unit: "gpu_second.h100-80gb-sxm", Currency: "JPY", UnitPrice: "0.105"},
		{Unit: "gpu_second.a100-80gb-sxm", Currency: "USD", UnitPrice: "0.0004"},
	})
	if err != nil {
		t.Fatal(err)
	}
	o := getOffer(t, member, "h100-80gb-sxm.2x")
	// 2 GPUs x 3600 s: USD 0.000694 -> 4.9968 -> 500 cents; EUR 0.0006 -> 4.32 -> 432;
	// JPY 0.105 -> 756 yen.
	want := []api.CatalogSKUPrice{
		{Currency: "EUR", UnitPrice: "0.0006", HourlyRate: api.Money{AmountMinor: 432, Currency: "EUR"}, PricingPlanID: def.ID, PricingPlanVersion: 1},
		{Currency: "JPY", UnitPrice: "0.105", HourlyRate: api.Money{AmountMinor: 756, Currency: "JPY"}, PricingPlanID: def.ID, PricingPlanVersion: 1},
		{Currency: "USD", UnitPrice: "0.000694", HourlyRate: api.Money{AmountMinor: 500, Currency: "USD"}, PricingPlanID: def.ID, PricingPlanVersion: 1},
	}
	if fmt.Sprint(o.Prices) != fmt.Sprint(want) {
		t.Fatalf("prices:\n got %+v\nwant %+v", o.Prices, want)
	}
	// A platform admin outside any tenant sees the default plan too.
	if o := getOffer(t, admin, "h100-80gb-sxm.2x"); fmt.Sprint(o.Prices) != fmt.Sprint(want) {
		t.Fatalf("admin prices: %+v", o.Prices)
	}

	// A tenant on its own plan sees that plan's prices. (Billing has no API yet that
	// assigns a customer plan, so the test seeds the billing account row.)
	own, err := e.App.Billing.CreatePlan(ctx, "acme", false, nil, []billing.PriceInput{
		{Unit: "gpu_second.h100-80gb-sxm", Currency: "USD", UnitPrice: "0.0005"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Pool.Exec(ctx, `INSERT INTO billing_accounts (id, tenant_id, customer_pricing_plan_id, created_at, updated_at)
		VALUES ($1, $2, $3, now(), now())`, uuid.New(), tenant.ID, own.ID); err != nil {
		t.Fatal(err)
	}
	o = getOffer(t, member, "h100-80gb-sxm.2x")
	if len(o.Prices) != 1 || o.Prices[0].HourlyRate != (api.Money{AmountMinor: 360, Currency: "USD"}) || o.Prices[0].PricingPlanID != own.ID {
		t.Fatalf("tenant plan prices: %+v", o.Prices)
	}

	// A new version takes over once it is in force.
	future := time.Now().Add(time.Hour)
	if _, err := e.App.Billing.NewPlanVersion(ctx, def.ID, &future, []billing.PriceInput{
		{Unit: "gpu_second.h100-80gb-sxm", Currency: "USD", UnitPrice: "1"},
	}); err != nil {
		t.Fatal(err)
	}
	if o := getOffer(t, admin, "h100-80gb-sxm.2x"); len(o.Prices) != 3 || o.Prices[2].PricingPlanVersion != 1 {
		t.Fatalf("a future version must not price now: %+v", o.Prices)
	}
}

func TestHourlyMinor(t *testing.T) {
	for _, c := range []struct {
		price string
		gpus  int32
		exp   int
		want  int64
	}{
		{"0.000694", 1, 2, 250},     // 2.4984 -> 2.50
		{"0.000694", 8, 2, 1999},    // 19.9872 -> 19.99
		{"0.0000013", 1, 2, 0},      // 0.00468 -> 0.00
		{"0.00000139", 1, 2, 1},     // 0.005004 -> 0.01 (half away from zero)
		{"0.000125", 1, 2, 45},      // 0.45 exactly
		{"0.0001", 16, 3, 5760},     // KWD, 5.760
		{"0.1", 1, 0, 360},          // JPY
		{"0.00000125", 1, 2, 0},     // 0.0045 -> 0.00
		{"0.000001388888", 1, 2, 0}, // 0.0049999968 -> 0.00
	} {
		got, err := catalog.HourlyMinor(c.price, c.gpus, c.exp)
		if err != nil || got != c.want {
			t.Errorf("HourlyMinor(%s, %d, %d) = %d, %v; want %d", c.price, c.gpus, c.exp, got, err, c.want)
		}
	}
}
