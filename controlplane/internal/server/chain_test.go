package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/server"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

type envelope struct {
	Code          string         `json:"code"`
	Message       string         `json:"message"`
	CorrelationID string         `json:"correlation_id"`
	Details       map[string]any `json:"details"`
}

func decodeEnvelope(t *testing.T, resp *http.Response) envelope {
	t.Helper()
	defer resp.Body.Close()
	var env envelope
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		t.Fatalf("decode envelope: %v", err)
	}
	if env.CorrelationID == "" || env.CorrelationID != resp.Header.Get("X-Request-Id") {
		t.Fatalf("correlation_id %q vs header %q", env.CorrelationID, resp.Header.Get("X-Request-Id"))
	}
	if env.Details["service"] != server.ServiceName {
		t.Fatalf("details.service = %v", env.Details["service"])
	}
	return env
}

func expectError(t *testing.T, resp *http.Response, status int, code string) envelope {
	t.Helper()
	if resp.StatusCode != status {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, status, body)
	}
	env := decodeEnvelope(t, resp)
	if env.Code != code {
		t.Fatalf("code %q, want %q (%s)", env.Code, code, env.Message)
	}
	return env
}

func TestCorrelationAndTrace(t *testing.T) {
	e := apitest.New(t)

	req := e.Request("GET", "/api/v1/health", "", "")
	req.Header.Set("X-Request-Id", "client-req-1")
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	resp := e.Do(req)
	resp.Body.Close()
	if got := resp.Header.Get("X-Request-Id"); got != "client-req-1" {
		t.Fatalf("X-Request-Id %q", got)
	}
	if got := resp.Header.Get("X-Trace-ID"); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("X-Trace-ID %q", got)
	}
	if tp := resp.Header.Get("traceparent"); !strings.Contains(tp, "4bf92f3577b34da6a3ce929d0e0e4736") {
		t.Fatalf("traceparent %q", tp)
	}

	// An over-long id is replaced, not refused.
	req = e.Request("GET", "/api/v1/health", "", "")
	req.Header.Set("X-Request-Id", strings.Repeat("x", 129))
	resp = e.Do(req)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(resp.Header.Get("X-Request-Id")) > 128 || resp.Header.Get("X-Request-Id") == "" {
		t.Fatalf("status %d id %q", resp.StatusCode, resp.Header.Get("X-Request-Id"))
	}
	req = e.Request("GET", "/api/v1/health", "", "")
	req.Header.Set("X-Request-Id", strings.Repeat("y", 128))
	resp = e.Do(req)
	resp.Body.Close()
	if resp.Header.Get("X-Request-Id") != strings.Repeat("y", 128) {
		t.Fatal("a 128-character id must be kept")
	}

	// Errors carry the same ids in the envelope.
	req = e.Request("GET", "/api/v1/me", "", "")
	req.Header.Set("X-Request-Id", "err-req-7")
	req.Header.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	env := expectError(t, e.Do(req), 401, "token_missing")
	if env.CorrelationID != "err-req-7" || env.Details["trace_id"] != "0af7651916cd43dd8448eb211c80319c" || env.Details["span_id"] == "" {
		t.Fatalf("envelope %+v", env)
	}
}

func TestUnknownRouteAndMethod(t *testing.T) {
	e := apitest.New(t)
	expectError(t, e.Do(e.Request("GET", "/api/v1/nope", "", "")), 404, "invalid_request")
	expectError(t, e.Do(e.Request("DELETE", "/api/v1/health", "", "")), 405, "invalid_request")
}

func TestStrictJSONAndBodyCap(t *testing.T) {
	e := apitest.New(t, apitest.WithConfig(func(c *appConfig) { c.MaxBodyBytes = 4096 }))
	_, adminTok := e.PlatformAdmin(t)
	ten := e.NewTenant(t, adminTok, "Strict")

	env := expectError(t, e.Do(e.Request("POST", "/api/v1/projects", ten.AdminToken, `{"name":"p1","colour":"red"}`)), 422, "validation_error")
	if env.Details["field"] != "colour" {
		t.Fatalf("field %v (%s)", env.Details["field"], env.Message)
	}
	env = expectError(t, e.Do(e.Request("POST", "/api/v1/projects", ten.AdminToken, `{"name":""}`)), 422, "validation_error")
	if env.Details["field"] != "name" {
		t.Fatalf("field %v (%s)", env.Details["field"], env.Message)
	}
	expectError(t, e.Do(e.Request("POST", "/api/v1/projects", ten.AdminToken, `{"name":`)), 400, "invalid_request")
	big := `{"name":"` + strings.Repeat("a", 5000) + `"}`
	env = expectError(t, e.Do(e.Request("POST", "/api/v1/projects", ten.AdminToken, big)), 413, "invalid_request")
	if env.Details["reason"] != "body_too_large" {
		t.Fatalf("details %v", env.Details)
	}
	// Nothing was persisted by any refused create.
	var n int
	if err := e.Pool.QueryRow(context.Background(), `SELECT count(*) FROM projects WHERE tenant_id = $1`, ten.ID).Scan(&n); err != nil || n != 1 {
		t.Fatalf("projects %d err %v", n, err)
	}
}

func TestPageSizeLimits(t *testing.T) {
	e := apitest.New(t)
	_, adminTok := e.PlatformAdmin(t)
	for _, tc := range []struct {
		q      string
		status int
		size   int
	}{
		{"", 200, 50}, {"?page_size=1", 200, 1}, {"?page_size=200", 200, 200},
		{"?page_size=0", 422, 0}, {"?page_size=201", 422, 0}, {"?page_size=x", 422, 0},
	} {
		resp := e.Do(e.Request("GET", "/api/v1/admin/tenants"+tc.q, adminTok, ""))
		if tc.status != 200 {
			env := expectError(t, resp, tc.status, "validation_error")
			if env.Details["field"] != "page_size" {
				t.Fatalf("%s: field %v", tc.q, env.Details["field"])
			}
			continue
		}
		var body api.TenantListResponse
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %v", tc.q, resp.StatusCode, err)
		}
		resp.Body.Close()
		if body.Pagination.PageSize != tc.size {
			t.Fatalf("%s: page_size %d want %d", tc.q, body.Pagination.PageSize, tc.size)
		}
	}
	expectError(t, e.Do(e.Request("GET", "/api/v1/admin/tenants?cursor=forged", adminTok, "")), 400, "invalid_request")
}

func TestProjectContextRules(t *testing.T) {
	e := apitest.New(t)
	_, adminTok := e.PlatformAdmin(t)
	a := e.NewTenant(t, adminTok, "Tenant A")
	b := e.NewTenant(t, adminTok, "Tenant B")
	memberID, memberTok := e.NewUser(t, a.AdminToken, "member")
	_ = memberID

	// Another tenant's project, by path: 403, and the project is not revealed.
	expectError(t, e.Do(e.Request("GET", "/api/v1/projects/"+b.DefaultProject.String(), a.AdminToken, "")), 403, "insufficient_permissions")
	expectError(t, e.Do(e.Request("GET", "/api/v1/projects/"+uuid.NewString(), a.AdminToken, "")), 403, "insufficient_permissions")
	expectError(t, e.Do(e.Request("PATCH", "/api/v1/projects/"+b.DefaultProject.String(), a.AdminToken, `{"name":"pwned"}`)), 403, "insufficient_permissions")
	// A tenant member who is not a member of the project.
	expectError(t, e.Do(e.Request("GET", "/api/v1/projects/"+a.DefaultProject.String(), memberTok, "")), 403, "insufficient_permissions")

	// Header and path disagree: 400 before anything else.
	req := e.Request("GET", "/api/v1/projects/"+a.DefaultProject.String(), a.AdminToken, "")
	req.Header.Set("X-Project-ID", b.DefaultProject.String())
	env := expectError(t, e.Do(req), 400, "invalid_request")
	if env.Details["reason"] != "project_context_mismatch" {
		t.Fatalf("details %v", env.Details)
	}
	// Header and path agree: fine.
	req = e.Request("GET", "/api/v1/projects/"+a.DefaultProject.String(), a.AdminToken, "")
	req.Header.Set("X-Project-ID", a.DefaultProject.String())
	if resp := e.Do(req); resp.StatusCode != 200 {
		t.Fatalf("matching header: %d", resp.StatusCode)
	}

	// B's name is unchanged.
	var name string
	if err := e.Pool.QueryRow(context.Background(), `SELECT name FROM projects WHERE id = $1`, b.DefaultProject).Scan(&name); err != nil || name == "pwned" {
		t.Fatalf("name %q err %v", name, err)
	}
}

func TestRoutesMatchContract(t *testing.T) {
	e := apitest.New(t)
	routes, err := server.Routes(e.App.Handler)
	if err != nil {
		t.Fatal(err)
	}
	routed := map[string]bool{}
	for _, r := range routes {
		key := r[0] + " " + r[1]
		routed[key] = true
		if e.App.Contract.Op(r[0], r[1]) == nil {
			t.Errorf("route %s is not in the contract", key)
		}
	}
	ops := e.App.Contract.Ops()
	for _, op := range ops {
		if !routed[op.Method+" "+op.Path] {
			t.Errorf("contract operation %s %s (%s) is not routed", op.Method, op.Path, op.ID)
		}
	}
	if len(ops) < 30 {
		t.Fatalf("only %d operations", len(ops))
	}
}

func TestMetricsPassPromtool(t *testing.T) {
	e := apitest.New(t)
	for i := 0; i < 3; i++ {
		e.Do(e.Request("GET", "/api/v1/health", "", "")).Body.Close()
	}
	resp := e.Do(e.Request("GET", "/metrics", "", ""))
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, name := range []string{
		"api_ratelimit_fail_open_total", "api_idempotency_persisted_body_json_total",
		"api_idempotency_skipped_body_empty_total", "api_idempotency_skipped_body_non_json_total",
		"api_idempotency_replays_served_total",
		`api_http_requests_total{code="200",method="GET",route="/api/v1/health"} 3`,
		`api_http_request_duration_seconds_bucket{method="GET",route="/api/v1/health"`,
	} {
		if !strings.Contains(text, name) {
			t.Errorf("metrics lack %s", name)
		}
	}
	promtool, err := exec.LookPath("promtool")
	ci.SkipUnlessAvailable(t, "promtool (apt-get install prometheus)", err)
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
	_ = os.Stdout
	_ = fmt.Sprint
}
