package server_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/nodetoken"
)

// deniedRow is one auth.denied audit row as stored.
type deniedRow struct {
	ActorType   string
	ActorUserID *uuid.UUID
	ProjectID   *uuid.UUID
	TargetID    string
	Correlation string
	Meta        map[string]any
}

func deniedRows(t *testing.T, e *apitest.Env) []deniedRow {
	t.Helper()
	rows, err := e.Pool.Query(context.Background(), `SELECT actor_type, actor_user_id, project_id, target_id, correlation_id, metadata
		FROM audit_events WHERE action = 'auth.denied' AND result = 'failure' ORDER BY occurred_at, target_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []deniedRow
	for rows.Next() {
		var r deniedRow
		var meta []byte
		if err := rows.Scan(&r.ActorType, &r.ActorUserID, &r.ProjectID, &r.TargetID, &r.Correlation, &meta); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(meta, &r.Meta); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// find is the row of code on target (fails the test unless exactly one).
func find(t *testing.T, rows []deniedRow, target, code string) deniedRow {
	t.Helper()
	var hits []deniedRow
	for _, r := range rows {
		if r.TargetID == target && r.Meta["code"] == code {
			hits = append(hits, r)
		}
	}
	if len(hits) != 1 {
		t.Fatalf("%d auth.denied rows for %s %s, want 1 (all: %+v)", len(hits), target, code, rows)
	}
	return hits[0]
}

func send(t *testing.T, e *apitest.Env, method, path, token string, hdr map[string]string) (int, string) {
	t.Helper()
	req := e.Request(method, path, token, "")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp := e.Do(req)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("X-Request-Id")
}

// TestDenialsAreAuditedAndAggregated: every 401 and 403 (bearer check, project check,
// admin operations) becomes an auth.denied audit row, one per actor, operation and
// code per window with the count; anonymous callers are told apart by address.
func TestDenialsAreAuditedAndAggregated(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 11, 25, 12, 0, 5, 0, time.UTC))
	e := apitest.New(t, apitest.WithOptions(func(o *app.Options) { o.Clock = clk }))
	adminID, adminTok := e.PlatformAdmin(t)
	ten := e.NewTenant(t, adminTok, "Denied")
	other := e.NewTenant(t, adminTok, "Other")
	ctx := context.Background()

	// 30 admin_required from one user on one operation: one row, count 30.
	var firstCorr string
	for i := range 30 {
		status, corr := send(t, e, "GET", "/api/v1/admin/tenants", ten.AdminToken, nil)
		if status != 403 {
			t.Fatalf("admin_required: %d", status)
		}
		if i == 0 {
			firstCorr = corr
		}
	}
	// insufficient_permissions: a project of another tenant, named in the path.
	if status, _ := send(t, e, "GET", "/api/v1/projects/"+other.DefaultProject.String(), ten.AdminToken, nil); status != 403 {
		t.Fatalf("insufficient_permissions: %d", status)
	}
	// 401s: anonymous, so keyed by address.
	for range 5 {
		if status, _ := send(t, e, "GET", "/api/v1/me", "", nil); status != 401 {
			t.Fatalf("token_missing: %d", status)
		}
	}
	if status, _ := send(t, e, "GET", "/api/v1/me", "not.a.jwt", nil); status != 401 {
		t.Fatalf("token_invalid: %d", status)
	}

	// Nothing is written while the window is open: Flush writes closed windows only.
	if err := e.App.Denials.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if rows := deniedRows(t, e); len(rows) != 0 {
		t.Fatalf("rows written before the window closed: %+v", rows)
	}
	clk.Advance(time.Minute)
	if err := e.App.Denials.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	rows := deniedRows(t, e)
	if len(rows) != 4 {
		t.Fatalf("%d rows, want 4: %+v", len(rows), rows)
	}
	admin := find(t, rows, "GET /api/v1/admin/tenants", "admin_required")
	if admin.ActorType != "user" || admin.ActorUserID == nil || *admin.ActorUserID != ten.AdminID ||
		admin.Meta["count"] != float64(30) || admin.Correlation != firstCorr || admin.Meta["status"] != float64(403) ||
		admin.Meta["ip"] != "127.0.0.1" || admin.Meta["operation_id"] == nil {
		t.Fatalf("admin_required row: %+v (first correlation %s)", admin, firstCorr)
	}
	proj := find(t, rows, "GET /api/v1/projects/{project_id}", "insufficient_permissions")
	if proj.ProjectID == nil || *proj.ProjectID != other.DefaultProject || proj.Meta["count"] != float64(1) ||
		proj.ActorUserID == nil || *proj.ActorUserID != ten.AdminID {
		t.Fatalf("insufficient_permissions row: %+v", proj)
	}
	missing := find(t, rows, "GET /api/v1/me", "token_missing")
	if missing.ActorUserID != nil || missing.Meta["count"] != float64(5) || missing.Meta["ip"] != "127.0.0.1" {
		t.Fatalf("token_missing row: %+v", missing)
	}
	find(t, rows, "GET /api/v1/me", "token_invalid")

	// A new window is a new row; the closed one is never touched (append-only).
	send(t, e, "GET", "/api/v1/admin/tenants", ten.AdminToken, nil)
	if err := e.App.Denials.FlushAll(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM audit_events WHERE action = 'auth.denied' AND actor_user_id = $1`, ten.AdminID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 3 { // admin_required twice (two windows) + insufficient_permissions
		t.Fatalf("%d rows of the tenant admin, want 3", n)
	}

	// The audit API lists them under result=failure.
	resp := e.Do(e.Request("GET", "/api/v1/admin/audit?result=failure&action=auth.denied", adminTok, ""))
	var page struct {
		Items []struct {
			Result   string         `json:"result"`
			TargetID string         `json:"target_id"`
			Metadata map[string]any `json:"metadata"`
		} `json:"items"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil || resp.StatusCode != 200 {
		t.Fatalf("audit list: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	if len(page.Items) != 5 {
		t.Fatalf("audit list has %d failure rows, want 5", len(page.Items))
	}
	for _, it := range page.Items {
		if it.Result != "failure" || it.Metadata["count"] == nil {
			t.Fatalf("listed row %+v", it)
		}
	}
	_ = adminID
}

// TestDenialFloodIsBounded: a flood of denials from one caller is one row per window.
func TestDenialFloodIsBounded(t *testing.T) {
	e := apitest.New(t)
	_, adminTok := e.PlatformAdmin(t)
	ten := e.NewTenant(t, adminTok, "Flood")
	for range 300 {
		if status, _ := send(t, e, "GET", "/api/v1/admin/tenants", ten.AdminToken, nil); status != 403 {
			t.Fatalf("status %d", status)
		}
	}
	if err := e.App.Denials.FlushAll(context.Background()); err != nil {
		t.Fatal(err)
	}
	var rows int
	var total int64
	if err := e.Pool.QueryRow(context.Background(), `SELECT count(*), coalesce(sum((metadata->>'count')::bigint), 0)
		FROM audit_events WHERE action = 'auth.denied'`).Scan(&rows, &total); err != nil {
		t.Fatal(err)
	}
	// The real clock may cross a minute boundary once during the flood.
	if rows < 1 || rows > 2 || total != 300 {
		t.Fatalf("%d rows counting %d denials, want 1 (or 2 across a minute) counting 300", rows, total)
	}
}

// TestUnauthorizedChallenge: every 401 carries WWW-Authenticate (RFC 6750 §3), with
// error="invalid_token" only when a bearer was sent; a 403 carries none.
func TestUnauthorizedChallenge(t *testing.T) {
	e := apitest.New(t)
	_, adminTok := e.PlatformAdmin(t)
	ten := e.NewTenant(t, adminTok, "Challenge")

	check := func(name string, req *http.Request, status int, code, want string) {
		t.Helper()
		resp := e.Do(req)
		got := resp.Header.Values("WWW-Authenticate")
		env := expectError(t, resp, status, code)
		_ = env
		if want == "" && len(got) != 0 || want != "" && (len(got) != 1 || got[0] != want) {
			t.Fatalf("%s: WWW-Authenticate %q, want %q", name, got, want)
		}
	}
	plain := `Bearer realm="gantry"`
	invalid := `Bearer realm="gantry", error="invalid_token"`
	check("no token", e.Request("GET", "/api/v1/me", "", ""), 401, "token_missing", plain)
	check("bad token", e.Request("GET", "/api/v1/me", "not.a.jwt", ""), 401, "token_invalid", invalid)
	basic := e.Request("GET", "/api/v1/me", "", "")
	basic.Header.Set("Authorization", "Basic dXNlcjpwYXNz")
	check("basic scheme", basic, 401, "token_missing", plain)
	check("node route, no token", e.Request("POST", "/api/v1/internal/nodes/"+uuid.NewString()+"/token/introspect", "", ""), 401, "token_missing", plain)
	check("wrong password", e.Request("POST", "/api/v1/auth/login", "", `{"username":"`+ten.AdminUsername+`","password":"wrong password 123"}`), 401, "token_invalid", plain)
	check("forbidden", e.Request("GET", "/api/v1/admin/tenants", ten.AdminToken, ""), 403, "admin_required", "")
}

// TestOtherGantryTokensAsBearer: a refresh, node, enrollment or terminal token sent as
// the bearer is token_scope_invalid (docs/api.md), not token_invalid.
func TestOtherGantryTokensAsBearer(t *testing.T) {
	e := apitest.New(t)
	_, adminTok := e.PlatformAdmin(t)
	ten := e.NewTenant(t, adminTok, "Scopes")

	resp := e.Do(e.Request("POST", "/api/v1/auth/login", "", `{"username":"`+ten.AdminUsername+`","password":"`+apitest.Password+`"}`))
	var login struct {
		RefreshToken string `json:"refresh_token"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&login); err != nil || resp.StatusCode != 200 || !strings.HasPrefix(login.RefreshToken, "grt_") {
		t.Fatalf("login: %d %v %q", resp.StatusCode, err, login.RefreshToken)
	}
	resp.Body.Close()
	node, err := nodetoken.New(uuid.New(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	terminal := base64.RawURLEncoding.EncodeToString(secret) // terminal/token.go's shape
	for name, tok := range map[string]string{"refresh": login.RefreshToken, "node": node, "enrollment": "gne_" + terminal, "terminal": terminal} {
		resp := e.Do(e.Request("GET", "/api/v1/me", tok, ""))
		if got := resp.Header.Get("WWW-Authenticate"); got != `Bearer realm="gantry", error="invalid_token"` {
			t.Fatalf("%s: WWW-Authenticate %q", name, got)
		}
		env := expectError(t, resp, 401, "token_scope_invalid")
		if strings.Contains(env.Message, tok) {
			t.Fatalf("%s: message repeats the token", name)
		}
	}
}
