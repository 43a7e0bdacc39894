package catalog_test

import (
	"context"
	"encoding/json"
	"net"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// okDialer stands in for the network of the node probe: the nodes of these tests live
// on private addresses this machine does not have. Every dial "connects".
type okDialer struct{}

func (okDialer) DialContext(context.Context, string, string) (net.Conn, error) {
	c1, c2 := net.Pipe()
	_ = c2.Close()
	return c1, nil
}

func env(t *testing.T) *apitest.Env {
	return apitest.New(t, apitest.WithOptions(func(o *app.Options) { o.NodeProbeDialer = okDialer{} }))
}

func wantError(t *testing.T, body []byte, got, status int, code, reason string) {
	t.Helper()
	var e api.ErrorResponse
	_ = json.Unmarshal(body, &e)
	if got != status || string(e.Code) != code || (reason != "" && e.Details["reason"] != reason) {
		t.Fatalf("got %d %s/%v, want %d %s/%s: %s", got, e.Code, e.Details["reason"], status, code, reason, body)
	}
}

func count(t *testing.T, e *apitest.Env, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := e.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// writes counts the catalog's audit rows and outbox events.
func writes(t *testing.T, e *apitest.Env) (audits, events int) {
	t.Helper()
	return count(t, e, `SELECT count(*) FROM audit_events WHERE action LIKE 'catalog.%'`),
		count(t, e, `SELECT count(*) FROM outbox_events WHERE event_type LIKE 'catalog.%'`)
}

func ptr[T any](v T) *T { return &v }

func createRegion(t *testing.T, c *api.ClientWithResponses, code string, state api.V3RegionAvailabilityState, isDefault bool) api.V3Region {
	t.Helper()
	r, err := c.CreateRegionWithResponse(context.Background(), &api.CreateRegionParams{}, api.CreateRegionJSONRequestBody{
		Code: code, Label: "Region " + code, AvailabilityState: &state, IsDefault: &isDefault,
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.StatusCode() != 201 {
		t.Fatalf("create region: %d %s", r.StatusCode(), r.Body)
	}
	return *r.JSON201
}

func h100SKU(id string, gpus int, regions ...string) api.CreateSkuJSONRequestBody {
	return api.CreateSkuJSONRequestBody{
		ID: id, GpuModel: "NVIDIA H100 80GB HBM3", GpuCount: gpus, Vcpu: 26 * gpus, MemoryGib: 225 * gpus,
		DiskGib: 2000, UsageUnit: "gpu_second.h100-80gb-sxm", Regions: regions,
	}
}

func createSKU(t *testing.T, c *api.ClientWithResponses, body api.CreateSkuJSONRequestBody) api.SKU {
	t.Helper()
	r, err := c.CreateSkuWithResponse(context.Background(), &api.CreateSkuParams{}, body)
	if err != nil {
		t.Fatal(err)
	}
	if r.StatusCode() != 201 {
		t.Fatalf("create sku: %d %s", r.StatusCode(), r.Body)
	}
	return *r.JSON201
}
