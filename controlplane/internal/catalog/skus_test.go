package catalog_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/catalog"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

func TestAdminSKULifecycle(t *testing.T) {
	e := env(t)
	ctx := context.Background()
	_, tok := e.PlatformAdmin(t)
	admin := e.Client(tok)
	createRegion(t, admin, "eu-west-1", "available", true)
	createRegion(t, admin, "us-east-1", "available", false)

	k := createSKU(t, admin, h100SKU("h100-80gb-sxm.1x", 1, "us-east-1", "eu-west-1"))
	if k.ID != "h100-80gb-sxm.1x" || k.DisplayName != k.ID || !k.Active || k.GpuCount != 1 ||
		!slices.Equal(k.Regions, []string{"eu-west-1", "us-east-1"}) {
		t.Fatalf("created %+v", k)
	}
	createSKU(t, admin, h100SKU("h100-80gb-sxm.8x", 8))
	if a, ev := writes(t, e); a != 4 || ev != 4 { // two regions, two SKUs
		t.Fatalf("writes after create: %d audits, %d events", a, ev)
	}

	// A taken id is a 409 and writes nothing.
	r, err := admin.CreateSkuWithResponse(ctx, &api.CreateSkuParams{}, h100SKU("h100-80gb-sxm.1x", 1))
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, r.Body, r.StatusCode(), 409, "invalid_request", "sku_exists")

	// Paging by id.
	l, err := admin.ListAdminSkusWithResponse(ctx, &api.ListAdminSkusParams{PageSize: ptr(1)})
	if err != nil || l.StatusCode() != 200 || len(l.JSON200.Items) != 1 || l.JSON200.Pagination.NextCursor == nil {
		t.Fatalf("list: %v %s", err, l.Body)
	}
	l2, err := admin.ListAdminSkusWithResponse(ctx, &api.ListAdminSkusParams{PageSize: ptr(1), Cursor: l.JSON200.Pagination.NextCursor})
	if err != nil || l2.StatusCode() != 200 || len(l2.JSON200.Items) != 1 || l2.JSON200.Items[0].ID != "h100-80gb-sxm.8x" ||
		l2.JSON200.Pagination.NextCursor != nil {
		t.Fatalf("page 2: %v %s", err, l2.Body)
	}

	// Patch: a change writes once; the same patch again writes nothing.
	patch := api.UpdateSkuJSONRequestBody{DisplayName: ptr("H100 SXM x1"), Active: ptr(false), Regions: []string{"eu-west-1"}}
	u, err := admin.UpdateSkuWithResponse(ctx, k.ID, &api.UpdateSkuParams{}, patch)
	if err != nil || u.StatusCode() != 200 || u.JSON200.DisplayName != "H100 SXM x1" || u.JSON200.Active ||
		!slices.Equal(u.JSON200.Regions, []string{"eu-west-1"}) || u.JSON200.GpuModel != k.GpuModel {
		t.Fatalf("patch: %v %s", err, u.Body)
	}
	u, err = admin.UpdateSkuWithResponse(ctx, k.ID, &api.UpdateSkuParams{}, patch)
	if err != nil || u.StatusCode() != 200 {
		t.Fatalf("repeat patch: %v %s", err, u.Body)
	}
	if a, ev := writes(t, e); a != 5 || ev != 5 {
		t.Fatalf("writes after patches: %d audits, %d events", a, ev)
	}
	g, err := admin.GetAdminSkuWithResponse(ctx, k.ID, &api.GetAdminSkuParams{})
	if err != nil || g.StatusCode() != 200 || g.JSON200.Active {
		t.Fatalf("get: %v %s", err, g.Body)
	}

	// Delete, then the SKU is gone everywhere.
	d, err := admin.DeleteSkuWithResponse(ctx, k.ID, &api.DeleteSkuParams{})
	if err != nil || d.StatusCode() != 204 {
		t.Fatalf("delete: %v %s", err, d.Body)
	}
	g, _ = admin.GetAdminSkuWithResponse(ctx, k.ID, &api.GetAdminSkuParams{})
	wantError(t, g.Body, g.StatusCode(), 404, "sku_not_found", "")
	d, _ = admin.DeleteSkuWithResponse(ctx, k.ID, &api.DeleteSkuParams{})
	wantError(t, d.Body, d.StatusCode(), 404, "sku_not_found", "")
	u, _ = admin.UpdateSkuWithResponse(ctx, "no-such.1x", &api.UpdateSkuParams{}, patch)
	wantError(t, u.Body, u.StatusCode(), 404, "sku_not_found", "")
	if a, ev := writes(t, e); a != 6 || ev != 6 {
		t.Fatalf("writes after delete: %d audits, %d events", a, ev)
	}
	if n := count(t, e, `SELECT count(*) FROM audit_events WHERE action = 'catalog.sku.delete' AND target_id = $1`, k.ID); n != 1 {
		t.Fatalf("delete audit rows: %d", n)
	}
}

func TestSKUValidation(t *testing.T) {
	e := env(t)
	ctx := context.Background()
	_, tok := e.PlatformAdmin(t)
	admin := e.Client(tok)
	createRegion(t, admin, "eu-west-1", "available", false)
	a0, ev0 := writes(t, e)

	long := strings.Repeat("a", 61) + ".1x" // 64 characters: the longest id
	if len(long) != 64 {
		t.Fatal(len(long))
	}
	createSKU(t, admin, h100SKU(long, 1))
	createSKU(t, admin, h100SKU("a.16x", 16))
	a0, ev0 = a0+2, ev0+2

	cases := []struct {
		name   string
		edit   func(*api.CreateSkuJSONRequestBody)
		field  string
		reason string
	}{
		{"id too long", func(b *api.CreateSkuJSONRequestBody) { b.ID = "a" + long }, "", ""},
		{"id without count", func(b *api.CreateSkuJSONRequestBody) { b.ID = "h100-80gb-sxm" }, "", ""},
		{"id uppercase", func(b *api.CreateSkuJSONRequestBody) { b.ID = "H100.1x" }, "", ""},
		{"id zero count", func(b *api.CreateSkuJSONRequestBody) { b.ID = "h100.0x" }, "", ""},
		{"id trailing hyphen", func(b *api.CreateSkuJSONRequestBody) { b.ID = "h100-.1x" }, "", ""},
		{"count mismatch", func(b *api.CreateSkuJSONRequestBody) { b.ID = "h100-80gb-sxm.2x" }, "id", "gpu_count_mismatch"},
		{"gpu count 0", func(b *api.CreateSkuJSONRequestBody) { b.ID, b.GpuCount = "h100.1x", 0 }, "", ""},
		{"gpu count 17", func(b *api.CreateSkuJSONRequestBody) { b.ID, b.GpuCount = "h100.17x", 17 }, "", ""},
		{"vcpu 0", func(b *api.CreateSkuJSONRequestBody) { b.Vcpu = 0 }, "", ""},
		{"memory over", func(b *api.CreateSkuJSONRequestBody) { b.MemoryGib = 65537 }, "", ""},
		{"empty model", func(b *api.CreateSkuJSONRequestBody) { b.GpuModel = "" }, "", ""},
		{"model too long", func(b *api.CreateSkuJSONRequestBody) { b.GpuModel = strings.Repeat("x", 129) }, "", ""},
		{"model padded", func(b *api.CreateSkuJSONRequestBody) { b.GpuModel = " NVIDIA H100" }, "gpu_model", ""},
		{"bad unit", func(b *api.CreateSkuJSONRequestBody) { b.UsageUnit = "GPU Second" }, "", ""},
		{"unknown region", func(b *api.CreateSkuJSONRequestBody) { b.Regions = []string{"eu-west-1", "mars-1"} }, "regions", "unknown_region"},
		{"duplicate region", func(b *api.CreateSkuJSONRequestBody) { b.Regions = []string{"eu-west-1", "eu-west-1"} }, "regions", ""},
		{"bad region", func(b *api.CreateSkuJSONRequestBody) { b.Regions = []string{"EU"} }, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := h100SKU("h100-80gb-sxm.1x", 1)
			c.edit(&body)
			r, err := admin.CreateSkuWithResponse(ctx, &api.CreateSkuParams{}, body)
			if err != nil {
				t.Fatal(err)
			}
			wantError(t, r.Body, r.StatusCode(), 422, "validation_error", c.reason)
			if c.field != "" && r.JSON422.Details["field"] != c.field {
				t.Fatalf("field %v, want %s", r.JSON422.Details["field"], c.field)
			}
		})
	}
	// Patches are checked the same way; the GPU shape cannot be patched at all.
	for name, body := range map[string]string{
		"empty":          `{}`,
		"vcpu over":      `{"vcpu": 1025}`,
		"unknown region": `{"regions": ["mars-1"]}`,
		"gpu_count":      `{"gpu_count": 2}`,
		"gpu_model":      `{"gpu_model": "NVIDIA A100"}`,
	} {
		resp := e.Do(e.Request(http.MethodPatch, "/api/v1/admin/skus/a.16x", tok, body))
		resp.Body.Close()
		if resp.StatusCode != 422 {
			t.Fatalf("patch %s: %d", name, resp.StatusCode)
		}
	}
	if n := count(t, e, `SELECT count(*) FROM catalog_skus`); n != 2 {
		t.Fatalf("skus stored: %d", n)
	}
	if a, ev := writes(t, e); a != a0 || ev != ev0 {
		t.Fatalf("bad input wrote %d audits, %d events", a-a0, ev-ev0)
	}
}

func TestCatalogPermissions(t *testing.T) {
	e := env(t)
	ctx := context.Background()
	_, tok := e.PlatformAdmin(t)
	admin := e.Client(tok)
	createRegion(t, admin, "eu-west-1", "available", true)
	createSKU(t, admin, h100SKU("h100-80gb-sxm.1x", 1, "eu-west-1"))
	tenant := e.NewTenant(t, tok, "Acme")
	_, memberTok := e.NewUser(t, tenant.AdminToken, "member")

	admins := []struct{ method, path, body string }{
		{"GET", "/api/v1/admin/skus", ""},
		{"POST", "/api/v1/admin/skus", `{"id":"a.1x","gpu_model":"M","gpu_count":1,"vcpu":1,"memory_gib":1,"disk_gib":1,"usage_unit":"u"}`},
		{"GET", "/api/v1/admin/skus/h100-80gb-sxm.1x", ""},
		{"PATCH", "/api/v1/admin/skus/h100-80gb-sxm.1x", `{"active":false}`},
		{"DELETE", "/api/v1/admin/skus/h100-80gb-sxm.1x", ""},
		{"GET", "/api/v1/admin/os-images", ""},
		{"POST", "/api/v1/admin/os-images", `{"name":"u","distribution":"ubuntu","version":"22.04","image_ref":"x"}`},
		{"GET", "/api/v1/admin/os-images/0190a0a0-0000-7000-8000-000000000000", ""},
		{"PATCH", "/api/v1/admin/os-images/0190a0a0-0000-7000-8000-000000000000", `{"active":false}`},
		{"DELETE", "/api/v1/admin/os-images/0190a0a0-0000-7000-8000-000000000000", ""},
		{"POST", "/api/v1/admin/regions", `{"code":"x","label":"X"}`},
		{"PATCH", "/api/v1/admin/regions/eu-west-1", `{"label":"X"}`},
	}
	for _, who := range []string{tenant.AdminToken, memberTok} {
		for _, op := range admins {
			resp := e.Do(e.Request(op.method, op.path, who, op.body))
			var body [4096]byte
			n, _ := resp.Body.Read(body[:])
			resp.Body.Close()
			wantError(t, body[:n], resp.StatusCode, 403, "admin_required", "")
		}
	}
	for _, op := range append(admins, struct{ method, path, body string }{"GET", "/api/v1/catalog/skus", ""},
		struct{ method, path, body string }{"GET", "/api/v1/v3/regions", ""}) {
		resp := e.Do(e.Request(op.method, op.path, "", op.body))
		resp.Body.Close()
		if resp.StatusCode != 401 {
			t.Fatalf("%s %s without a token: %d", op.method, op.path, resp.StatusCode)
		}
	}
	if a, _ := writes(t, e); a != 2 {
		t.Fatalf("refused calls wrote audit rows: %d", a)
	}

	// Any signed-in user reads the catalog.
	member := e.Client(memberTok)
	l, err := member.ListCatalogSkusWithResponse(ctx, &api.ListCatalogSkusParams{})
	if err != nil || l.StatusCode() != 200 || len(l.JSON200.Items) != 1 {
		t.Fatalf("member catalog: %v %s", err, l.Body)
	}
	g, err := member.GetCatalogSkuWithResponse(ctx, "h100-80gb-sxm.9x", &api.GetCatalogSkuParams{})
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, g.Body, g.StatusCode(), 404, "sku_not_found", "")
	rg, err := member.ListV3RegionsWithResponse(ctx, &api.ListV3RegionsParams{})
	if err != nil || rg.StatusCode() != 200 || len(rg.JSON200.Items) != 1 {
		t.Fatalf("member regions: %v %s", err, rg.Body)
	}
	im, err := member.ListCatalogOsImagesWithResponse(ctx, &api.ListCatalogOsImagesParams{})
	if err != nil || im.StatusCode() != 200 || len(im.JSON200.Items) != 0 {
		t.Fatalf("member images: %v %s", err, im.Body)
	}
}

type usedSKUs map[string]bool

func (u usedSKUs) SKUInUse(_ context.Context, sku string) (bool, error) { return u[sku], nil }

func TestDeleteSKUInUse(t *testing.T) {
	e := env(t)
	ctx := context.Background()
	_, tok := e.PlatformAdmin(t)
	createSKU(t, e.Client(tok), h100SKU("h100-80gb-sxm.1x", 1))
	svc := catalog.New(e.Pool, e.App.Clock, e.App.IDs, nil, nil)
	svc.Usage = usedSKUs{"h100-80gb-sxm.1x": true}
	err := svc.DeleteSKU(ctx, "h100-80gb-sxm.1x")
	if ae, ok := apierr.As(err); !ok || ae.HTTPStatus() != 409 || ae.Details["reason"] != "sku_in_use" {
		t.Fatalf("delete in use: %v", err)
	}
	if n := count(t, e, `SELECT count(*) FROM catalog_skus`); n != 1 {
		t.Fatalf("skus: %d", n)
	}
	// Without prices or a fleet the offer is the bare SKU.
	o, err := svc.Offer(ctx, uuid.Nil, "h100-80gb-sxm.1x")
	if err != nil || len(o.Prices) != 0 || len(o.Availability) != 0 {
		t.Fatalf("offer: %+v %v", o, err)
	}
}

func TestConcurrentCreateOneWins(t *testing.T) {
	e := env(t)
	_, tok := e.PlatformAdmin(t)
	admin := e.Client(tok)
	var wg sync.WaitGroup
	codes := make([]int, 8)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := admin.CreateSkuWithResponse(context.Background(), &api.CreateSkuParams{}, h100SKU("h100-80gb-sxm.1x", 1))
			if err == nil {
				codes[i] = r.StatusCode()
			}
		}()
	}
	wg.Wait()
	won := 0
	for _, c := range codes {
		switch c {
		case 201:
			won++
		case 409:
		default:
			t.Fatalf("codes %v", codes)
		}
	}
	if won != 1 {
		t.Fatalf("codes %v", codes)
	}
	if a, ev := writes(t, e); a != 1 || ev != 1 {
		t.Fatalf("writes %d/%d", a, ev)
	}
}
