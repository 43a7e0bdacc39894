package catalog_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/proto/api"
)

func TestRegions(t *testing.T) {
	e := env(t)
	ctx := context.Background()
	_, tok := e.PlatformAdmin(t)
	admin := e.Client(tok)

	l, err := admin.ListV3RegionsWithResponse(ctx, &api.ListV3RegionsParams{})
	if err != nil || l.StatusCode() != 200 || len(l.JSON200.Items) != 0 || l.JSON200.CurrentRegionCode != nil {
		t.Fatalf("empty: %v %s", err, l.Body)
	}
	eu := createRegion(t, admin, "eu-west-1", "available", true)
	if eu.APIRegionCode != "eu-west-1" || !eu.IsAvailable || !eu.IsDefault || eu.CapacityScopeHint != nil {
		t.Fatalf("created %+v", eu)
	}
	us := createRegion(t, admin, "us-east-1", "planned", true) // takes the default flag
	if us.IsAvailable || !us.IsDefault {
		t.Fatalf("created %+v", us)
	}
	l, _ = admin.ListV3RegionsWithResponse(ctx, &api.ListV3RegionsParams{})
	if len(l.JSON200.Items) != 2 || *l.JSON200.CurrentRegionCode != "us-east-1" || l.JSON200.Items[0].IsDefault {
		t.Fatalf("list: %s", l.Body)
	}

	r, _ := admin.CreateRegionWithResponse(ctx, &api.CreateRegionParams{}, api.CreateRegionJSONRequestBody{Code: "eu-west-1", Label: "again"})
	wantError(t, r.Body, r.StatusCode(), 409, "invalid_request", "region_exists")
	for _, body := range []string{`{"code":"EU","label":"x"}`, `{"code":"eu","label":""}`, `{"code":"eu"}`,
		`{"code":"eu","label":"x","availability_state":"open"}`, `{"code":"eu","label":"x","extra":1}`} {
		resp := e.Do(e.Request(http.MethodPost, "/api/v1/admin/regions", tok, body))
		resp.Body.Close()
		if resp.StatusCode != 422 {
			t.Fatalf("%s: %d", body, resp.StatusCode)
		}
	}

	a0, ev0 := writes(t, e)
	u, err := admin.UpdateRegionWithResponse(ctx, "eu-west-1", &api.UpdateRegionParams{}, api.UpdateRegionJSONRequestBody{
		Label: ptr("Europe West"), CapacityScopeHint: ptr("Frankfurt DC2"), IsDefault: ptr(true),
		AvailabilityState: ptr(api.V3RegionAvailabilityState("maintenance")),
	})
	if err != nil || u.StatusCode() != 200 || u.JSON200.Label != "Europe West" || *u.JSON200.CapacityScopeHint != "Frankfurt DC2" ||
		u.JSON200.IsAvailable || !u.JSON200.IsDefault {
		t.Fatalf("patch: %v %s", err, u.Body)
	}
	// The same patch changes nothing and writes nothing; "" clears the hint.
	u, _ = admin.UpdateRegionWithResponse(ctx, "eu-west-1", &api.UpdateRegionParams{}, api.UpdateRegionJSONRequestBody{Label: ptr("Europe West")})
	if a, ev := writes(t, e); a != a0+1 || ev != ev0+1 {
		t.Fatalf("writes: %d/%d", a-a0, ev-ev0)
	}
	u, _ = admin.UpdateRegionWithResponse(ctx, "eu-west-1", &api.UpdateRegionParams{}, api.UpdateRegionJSONRequestBody{CapacityScopeHint: ptr("")})
	if u.StatusCode() != 200 || u.JSON200.CapacityScopeHint != nil {
		t.Fatalf("clear hint: %s", u.Body)
	}
	l, _ = admin.ListV3RegionsWithResponse(ctx, &api.ListV3RegionsParams{})
	if *l.JSON200.CurrentRegionCode != "eu-west-1" {
		t.Fatalf("default moved back: %s", l.Body)
	}
	u, _ = admin.UpdateRegionWithResponse(ctx, "mars-1", &api.UpdateRegionParams{}, api.UpdateRegionJSONRequestBody{Label: ptr("x")})
	wantError(t, u.Body, u.StatusCode(), 404, "invalid_request", "not_found")
}

func TestOSImages(t *testing.T) {
	e := env(t)
	ctx := context.Background()
	_, tok := e.PlatformAdmin(t)
	admin := e.Client(tok)
	tenant := e.NewTenant(t, tok, "Acme")
	user := e.Client(tenant.AdminToken)

	mk := func(name string, isDefault, active bool) api.OSImage {
		t.Helper()
		r, err := admin.CreateOsImageWithResponse(ctx, &api.CreateOsImageParams{}, api.CreateOsImageJSONRequestBody{
			Name: name, Distribution: "ubuntu", Version: "22.04", ImageRef: "ubuntu-22.04-cuda-12.4", IsDefault: &isDefault, Active: &active,
		})
		if err != nil || r.StatusCode() != 201 {
			t.Fatalf("create image: %v %s", err, r.Body)
		}
		return *r.JSON201
	}
	a := mk("ubuntu-22.04-cuda", true, true)
	b := mk("ubuntu-24.04-cuda", true, true) // takes the default flag
	mk("rocky-9-old", false, false)
	if a.DisplayName != a.Name || !b.IsDefault {
		t.Fatalf("created %+v %+v", a, b)
	}
	g, _ := admin.GetAdminOsImageWithResponse(ctx, a.ID, &api.GetAdminOsImageParams{})
	if g.StatusCode() != 200 || g.JSON200.IsDefault {
		t.Fatalf("a still default: %s", g.Body)
	}
	r, _ := admin.CreateOsImageWithResponse(ctx, &api.CreateOsImageParams{}, api.CreateOsImageJSONRequestBody{
		Name: a.Name, Distribution: "ubuntu", Version: "1", ImageRef: "x",
	})
	wantError(t, r.Body, r.StatusCode(), 409, "invalid_request", "os_image_exists")
	for _, body := range []string{`{"name":"Ubuntu","distribution":"ubuntu","version":"1","image_ref":"x"}`,
		`{"name":"u","distribution":"ubuntu","version":"1","image_ref":""}`,
		`{"name":"u","distribution":"ubuntu","version":"1 2","image_ref":"x"}`} {
		resp := e.Do(e.Request(http.MethodPost, "/api/v1/admin/os-images", tok, body))
		resp.Body.Close()
		if resp.StatusCode != 422 {
			t.Fatalf("%s: %d", body, resp.StatusCode)
		}
	}

	// Admins page through every image by name; the catalog shows active ones.
	l, err := admin.ListAdminOsImagesWithResponse(ctx, &api.ListAdminOsImagesParams{PageSize: ptr(2)})
	if err != nil || len(l.JSON200.Items) != 2 || l.JSON200.Items[0].Name != "rocky-9-old" || l.JSON200.Pagination.NextCursor == nil {
		t.Fatalf("admin list: %v %s", err, l.Body)
	}
	// A cursor of the admin list is not accepted by the catalog list.
	cl, _ := user.ListCatalogOsImagesWithResponse(ctx, &api.ListCatalogOsImagesParams{Cursor: l.JSON200.Pagination.NextCursor})
	if cl.StatusCode() == 200 {
		t.Fatalf("foreign cursor accepted: %s", cl.Body)
	}
	cl, err = user.ListCatalogOsImagesWithResponse(ctx, &api.ListCatalogOsImagesParams{})
	if err != nil || cl.StatusCode() != 200 || len(cl.JSON200.Items) != 2 || cl.JSON200.Items[0].Name != a.Name {
		t.Fatalf("catalog list: %v %s", err, cl.Body)
	}

	u, err := admin.UpdateOsImageWithResponse(ctx, a.ID, &api.UpdateOsImageParams{}, api.UpdateOsImageJSONRequestBody{Active: ptr(false), Version: ptr("22.04.5")})
	if err != nil || u.StatusCode() != 200 || u.JSON200.Active || u.JSON200.Version != "22.04.5" {
		t.Fatalf("patch: %v %s", err, u.Body)
	}
	a0, _ := writes(t, e)
	u, _ = admin.UpdateOsImageWithResponse(ctx, a.ID, &api.UpdateOsImageParams{}, api.UpdateOsImageJSONRequestBody{Active: ptr(false)})
	if n, _ := writes(t, e); u.StatusCode() != 200 || n != a0 {
		t.Fatalf("no-op patch wrote %d", n-a0)
	}
	d, _ := admin.DeleteOsImageWithResponse(ctx, a.ID, &api.DeleteOsImageParams{})
	if d.StatusCode() != 204 {
		t.Fatalf("delete: %s", d.Body)
	}
	for _, id := range []uuid.UUID{a.ID, uuid.New()} {
		g, _ := admin.GetAdminOsImageWithResponse(ctx, id, &api.GetAdminOsImageParams{})
		wantError(t, g.Body, g.StatusCode(), 404, "invalid_request", "not_found")
		d, _ := admin.DeleteOsImageWithResponse(ctx, id, &api.DeleteOsImageParams{})
		wantError(t, d.Body, d.StatusCode(), 404, "invalid_request", "not_found")
	}
}

// Concurrent "make this the default" requests all succeed and leave exactly one default.
func TestConcurrentDefaults(t *testing.T) {
	e := env(t)
	_, tok := e.PlatformAdmin(t)
	admin := e.Client(tok)
	createRegion(t, admin, "r-0", "available", true)
	var wg sync.WaitGroup
	fails := make(chan string, 16)
	for i := 1; i <= 6; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			r, err := admin.CreateRegionWithResponse(context.Background(), &api.CreateRegionParams{},
				api.CreateRegionJSONRequestBody{Code: fmt.Sprintf("r-%d", i), Label: "R", IsDefault: ptr(true)})
			if err != nil || r.StatusCode() != 201 {
				fails <- fmt.Sprintf("create r-%d: %v %s", i, err, r.Body)
			}
		}()
		go func() {
			defer wg.Done()
			r, err := admin.UpdateRegionWithResponse(context.Background(), "r-0", &api.UpdateRegionParams{},
				api.UpdateRegionJSONRequestBody{IsDefault: ptr(true), Label: ptr(fmt.Sprint("R", i))})
			if err != nil || r.StatusCode() != 200 {
				fails <- fmt.Sprintf("update r-0: %v %s", err, r.Body)
			}
		}()
	}
	wg.Wait()
	close(fails)
	for f := range fails {
		t.Error(f)
	}
	if n := count(t, e, `SELECT count(*) FROM catalog_regions WHERE is_default`); n != 1 {
		t.Fatalf("%d default regions", n)
	}
}
