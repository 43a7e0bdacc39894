package budgets_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/proto/api"
)

// apiEnv is a control plane with one tenant, a member, a second project with an owner
// and a viewer, and the deterministic spend source behind budgets.
type apiEnv struct {
	*apitest.Env
	spend    *fakeSpend
	acme     apitest.Tenant
	admin    *api.ClientWithResponses // tenant admin
	member   *api.ClientWithResponses // tenant member, no role in "ml"
	owner    *api.ClientWithResponses // tenant member, owner of "ml"
	viewer   *api.ClientWithResponses // tenant member, viewer of "ml"
	outsider *api.ClientWithResponses // admin of another tenant
	ml       uuid.UUID
}

func newAPIEnv(t *testing.T) *apiEnv {
	t.Helper()
	env := apitest.New(t)
	e := &apiEnv{Env: env, spend: &fakeSpend{}}
	env.App.Budgets.Spend = e.spend
	_, root := env.PlatformAdmin(t)
	e.acme = env.NewTenant(t, root, "Acme")
	e.admin = env.Client(e.acme.AdminToken)
	_, memberTok := env.NewUser(t, e.acme.AdminToken, "member")
	_, ownerTok := env.NewUser(t, e.acme.AdminToken, "member")
	viewerID, viewerTok := env.NewUser(t, e.acme.AdminToken, "member")
	e.member, e.owner, e.viewer = env.Client(memberTok), env.Client(ownerTok), env.Client(viewerTok)
	e.outsider = env.Client(env.NewTenant(t, root, "Other").AdminToken)

	ctx := context.Background()
	pr, err := e.owner.CreateProjectWithResponse(ctx, &api.CreateProjectParams{}, api.CreateProjectJSONRequestBody{Name: "ml"})
	if err != nil || pr.StatusCode() != 201 {
		t.Fatalf("create project: %v %s", err, pr.Body)
	}
	e.ml = pr.JSON201.Project.ID
	mr, err := e.owner.AddProjectMemberWithResponse(ctx, e.ml, &api.AddProjectMemberParams{}, api.AddProjectMemberJSONRequestBody{UserID: viewerID, Role: api.ProjectRoleViewer})
	if err != nil || mr.StatusCode() != 201 {
		t.Fatalf("add viewer: %v %d %s", err, mr.StatusCode(), mr.Body)
	}
	return e
}

func wantAPIErr(t *testing.T, got int, body []byte, status int, code, reason string) api.ErrorResponse {
	t.Helper()
	var e api.ErrorResponse
	_ = json.Unmarshal(body, &e)
	if got != status || string(e.Code) != code || (reason != "" && e.Details["reason"] != reason) {
		t.Fatalf("got %d %s/%v, want %d %s/%s: %s", got, e.Code, e.Details["reason"], status, code, reason, body)
	}
	return e
}

func createReq(scope api.BillingBudgetScopeType, project *uuid.UUID, name string, amount int64, mode api.BillingBudgetEnforcementMode) api.CreateBillingBudgetJSONRequestBody {
	return api.CreateBillingBudgetJSONRequestBody{
		ScopeType: scope, ProjectID: project, Name: &name, Period: api.BillingBudgetCreateRequestPeriodMonthly,
		Amount: api.Money{AmountMinor: amount, Currency: "USD"}, EnforcementMode: &mode,
	}
}

func (e *apiEnv) create(c *api.ClientWithResponses, body api.CreateBillingBudgetJSONRequestBody) *api.CreateBillingBudgetHTTPResponse {
	e.T.Helper()
	r, err := c.CreateBillingBudgetWithResponse(context.Background(), &api.CreateBillingBudgetParams{}, body)
	if err != nil {
		e.T.Fatal(err)
	}
	return r
}

func (e *apiEnv) list(c *api.ClientWithResponses, params api.ListBillingBudgetsParams) []api.BillingBudgetPosture {
	e.T.Helper()
	r, err := c.ListBillingBudgetsWithResponse(context.Background(), &params)
	if err != nil || r.StatusCode() != 200 {
		e.T.Fatalf("list: %v %s", err, r.Body)
	}
	return r.JSON200.Items
}

func (e *apiEnv) rows(table string) int {
	e.T.Helper()
	var n int
	if err := e.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		e.T.Fatal(err)
	}
	return n
}

func TestAPIBudgetsCRUDAndPermissions(t *testing.T) {
	e := newAPIEnv(t)
	ctx := context.Background()

	// Tenant admins manage tenant budgets; members may not.
	r := e.create(e.member, createReq(api.BillingBudgetScopeTypeTenant, nil, "org cap", 500_00, api.BillingBudgetEnforcementModeNotifyOnly))
	wantAPIErr(t, r.StatusCode(), r.Body, 403, "insufficient_permissions", "")
	r = e.create(e.admin, createReq(api.BillingBudgetScopeTypeTenant, nil, "org cap", 500_00, api.BillingBudgetEnforcementModeNotifyOnly))
	if r.StatusCode() != 201 {
		t.Fatalf("create tenant budget: %d %s", r.StatusCode(), r.Body)
	}
	org := r.JSON201
	if org.Name != "org cap" || org.DisplayName != org.Name || org.ScopeType != "tenant" || org.ProjectID != nil ||
		org.OrgID != e.acme.ID || org.DepartmentID != e.acme.DefaultDept || org.ThresholdPercent != 80 || !org.Active ||
		org.LatestEvent != nil || org.StartsAt.Day() != 1 || org.EnforcementMode != "notify_only" {
		t.Fatalf("tenant budget: %+v", org)
	}

	// Project owners (and tenant admins) manage their project's budgets; viewers and
	// members read them.
	r = e.create(e.viewer, createReq(api.BillingBudgetScopeTypeProject, &e.ml, "ml cap", 100_00, api.BillingBudgetEnforcementModeBlockLaunch))
	wantAPIErr(t, r.StatusCode(), r.Body, 403, "insufficient_permissions", "")
	r = e.create(e.member, createReq(api.BillingBudgetScopeTypeProject, &e.ml, "ml cap", 100_00, api.BillingBudgetEnforcementModeBlockLaunch))
	wantAPIErr(t, r.StatusCode(), r.Body, 403, "insufficient_permissions", "")
	r = e.create(e.outsider, createReq(api.BillingBudgetScopeTypeProject, &e.ml, "ml cap", 100_00, api.BillingBudgetEnforcementModeBlockLaunch))
	wantAPIErr(t, r.StatusCode(), r.Body, 403, "insufficient_permissions", "")
	// display_name alone is accepted too (name and display_name are one value).
	body := createReq(api.BillingBudgetScopeTypeProject, &e.ml, "", 100_00, api.BillingBudgetEnforcementModeBlockLaunch)
	body.Name, body.DisplayName = nil, ptr("ml cap")
	r = e.create(e.owner, body)
	if r.StatusCode() != 201 || r.JSON201.Name != "ml cap" || r.JSON201.DisplayName != "ml cap" || *r.JSON201.ProjectID != e.ml {
		t.Fatalf("owner creates project budget: %d %s", r.StatusCode(), r.Body)
	}
	ml := r.JSON201
	r = e.create(e.admin, createReq(api.BillingBudgetScopeTypeProject, &e.acme.DefaultProject, "default cap", 100_00, api.BillingBudgetEnforcementModeSuspend))
	if r.StatusCode() != 201 {
		t.Fatalf("tenant admin creates project budget: %d %s", r.StatusCode(), r.Body)
	}
	dflt := r.JSON201

	names := func(items []api.BillingBudgetPosture) string {
		var s []string
		for _, it := range items {
			s = append(s, it.Name)
		}
		return strings.Join(s, ",")
	}
	if got := names(e.list(e.admin, api.ListBillingBudgetsParams{})); got != "org cap,ml cap,default cap" {
		t.Fatalf("admin sees %q", got)
	}
	if got := names(e.list(e.viewer, api.ListBillingBudgetsParams{})); got != "org cap,ml cap" {
		t.Fatalf("viewer sees %q", got)
	}
	if got := names(e.list(e.member, api.ListBillingBudgetsParams{})); got != "org cap" {
		t.Fatalf("member sees %q", got)
	}
	if got := names(e.list(e.outsider, api.ListBillingBudgetsParams{})); got != "" {
		t.Fatalf("another tenant sees %q", got)
	}
	scope := api.BillingBudgetScopeTypeProject
	if got := names(e.list(e.admin, api.ListBillingBudgetsParams{ScopeType: &scope})); got != "ml cap,default cap" {
		t.Fatalf("project scope filter: %q", got)
	}
	if got := names(e.list(e.viewer, api.ListBillingBudgetsParams{ProjectID: &e.ml})); got != "ml cap" {
		t.Fatalf("project filter: %q", got)
	}
	lr, _ := e.member.ListBillingBudgetsWithResponse(ctx, &api.ListBillingBudgetsParams{ProjectID: &e.ml})
	wantAPIErr(t, lr.StatusCode(), lr.Body, 403, "insufficient_permissions", "")

	// PATCH: viewers can read but not manage (403); those who cannot read get 404.
	patch := api.UpdateBillingBudgetJSONRequestBody{ThresholdPercent: ptr(90)}
	u, _ := e.viewer.UpdateBillingBudgetWithResponse(ctx, ml.ID, &api.UpdateBillingBudgetParams{}, patch)
	wantAPIErr(t, u.StatusCode(), u.Body, 403, "insufficient_permissions", "")
	u, _ = e.member.UpdateBillingBudgetWithResponse(ctx, ml.ID, &api.UpdateBillingBudgetParams{}, patch)
	wantAPIErr(t, u.StatusCode(), u.Body, 404, "invalid_request", "not_found")
	u, _ = e.outsider.UpdateBillingBudgetWithResponse(ctx, org.ID, &api.UpdateBillingBudgetParams{}, patch)
	wantAPIErr(t, u.StatusCode(), u.Body, 404, "invalid_request", "not_found")
	u, _ = e.member.UpdateBillingBudgetWithResponse(ctx, org.ID, &api.UpdateBillingBudgetParams{}, patch)
	wantAPIErr(t, u.StatusCode(), u.Body, 403, "insufficient_permissions", "")
	audits := e.rows("audit_events")
	u, _ = e.owner.UpdateBillingBudgetWithResponse(ctx, ml.ID, &api.UpdateBillingBudgetParams{}, api.UpdateBillingBudgetJSONRequestBody{
		ThresholdPercent: ptr(90), DisplayName: ptr("ml budget"), Amount: &api.Money{AmountMinor: 200_00, Currency: "EUR"},
	})
	if u.StatusCode() != 200 || u.JSON200.ThresholdPercent != 90 || u.JSON200.Name != "ml budget" || u.JSON200.Amount.Currency != "EUR" ||
		!u.JSON200.UpdatedAt.After(ml.UpdatedAt) && !u.JSON200.UpdatedAt.Equal(ml.UpdatedAt) {
		t.Fatalf("owner patch: %d %s", u.StatusCode(), u.Body)
	}
	if e.rows("audit_events") != audits+1 {
		t.Fatal("a changing patch writes one audit row")
	}
	// A patch that changes nothing writes nothing.
	u, _ = e.owner.UpdateBillingBudgetWithResponse(ctx, ml.ID, &api.UpdateBillingBudgetParams{}, api.UpdateBillingBudgetJSONRequestBody{ThresholdPercent: ptr(90)})
	if u.StatusCode() != 200 || e.rows("audit_events") != audits+1 {
		t.Fatalf("no-op patch: %d, audit rows %d", u.StatusCode(), e.rows("audit_events"))
	}

	// DELETE with the same roles.
	d, _ := e.viewer.DeleteBillingBudgetWithResponse(ctx, ml.ID, &api.DeleteBillingBudgetParams{})
	wantAPIErr(t, d.StatusCode(), d.Body, 403, "insufficient_permissions", "")
	d, _ = e.outsider.DeleteBillingBudgetWithResponse(ctx, dflt.ID, &api.DeleteBillingBudgetParams{})
	wantAPIErr(t, d.StatusCode(), d.Body, 404, "invalid_request", "not_found")
	d, _ = e.owner.DeleteBillingBudgetWithResponse(ctx, ml.ID, &api.DeleteBillingBudgetParams{})
	if d.StatusCode() != 204 {
		t.Fatalf("delete: %d %s", d.StatusCode(), d.Body)
	}
	d, _ = e.owner.DeleteBillingBudgetWithResponse(ctx, ml.ID, &api.DeleteBillingBudgetParams{})
	wantAPIErr(t, d.StatusCode(), d.Body, 404, "invalid_request", "not_found")
	var created, updated, deleted int
	if err := e.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE event_type = 'budget.created'), count(*) FILTER (WHERE event_type = 'budget.updated'),
		count(*) FILTER (WHERE event_type = 'budget.deleted') FROM outbox_events`).Scan(&created, &updated, &deleted); err != nil {
		t.Fatal(err)
	}
	if created != 3 || updated != 1 || deleted != 1 {
		t.Fatalf("outbox: created %d updated %d deleted %d", created, updated, deleted)
	}
	if e.Validated.Load() == 0 {
		t.Fatal("no response was validated against the contract")
	}
}

func TestAPIBudgetValidation(t *testing.T) {
	e := newAPIEnv(t)
	starts := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	valid := func() map[string]any {
		return map[string]any{
			"scope_type": "tenant", "name": "cap", "period": "monthly",
			"amount": map[string]any{"amount_minor": 100, "currency": "USD"},
		}
	}
	cases := []struct {
		name   string
		edit   func(m map[string]any)
		status int
		field  string
	}{
		{"threshold 0", func(m map[string]any) { m["threshold_percent"] = 0 }, 422, "threshold_percent"},
		{"threshold 1", func(m map[string]any) { m["threshold_percent"] = 1 }, 201, ""},
		{"threshold 100", func(m map[string]any) { m["threshold_percent"] = 100 }, 201, ""},
		{"threshold 101", func(m map[string]any) { m["threshold_percent"] = 101 }, 422, "threshold_percent"},
		{"name empty", func(m map[string]any) { m["name"] = "" }, 422, "name"},
		{"name blank", func(m map[string]any) { m["name"] = "   " }, 422, "name"},
		{"name 120", func(m map[string]any) { m["name"] = strings.Repeat("n", 120) }, 201, ""},
		{"name 120 runes", func(m map[string]any) { m["name"] = strings.Repeat("é", 120) }, 201, ""},
		{"name 121", func(m map[string]any) { m["name"] = strings.Repeat("n", 121) }, 422, "name"},
		{"no name at all", func(m map[string]any) { delete(m, "name") }, 422, "name"},
		{"name and display_name differ", func(m map[string]any) { m["display_name"] = "other" }, 422, "display_name"},
		{"name and display_name equal", func(m map[string]any) { m["display_name"] = "cap" }, 201, ""},
		{"currency lowercase", func(m map[string]any) { m["amount"] = map[string]any{"amount_minor": 100, "currency": "usd"} }, 422, "amount.currency"},
		{"currency two letters", func(m map[string]any) { m["amount"] = map[string]any{"amount_minor": 100, "currency": "US"} }, 422, "amount.currency"},
		{"currency four letters", func(m map[string]any) { m["amount"] = map[string]any{"amount_minor": 100, "currency": "USDX"} }, 422, "amount.currency"},
		{"amount zero", func(m map[string]any) { m["amount"] = map[string]any{"amount_minor": 0, "currency": "USD"} }, 422, "amount.amount_minor"},
		{"amount over 10^15", func(m map[string]any) {
			m["amount"] = map[string]any{"amount_minor": int64(1_000_000_000_000_001), "currency": "USD"}
		}, 422, "amount.amount_minor"},
		{"unknown field", func(m map[string]any) { m["colour"] = "red" }, 422, "colour"},
		{"custom without ends_at", func(m map[string]any) { m["period"] = "custom"; m["starts_at"] = starts }, 422, "ends_at"},
		{"custom without starts_at", func(m map[string]any) { m["period"] = "custom"; m["ends_at"] = starts }, 422, "starts_at"},
		{"custom ends_at == starts_at", func(m map[string]any) { m["period"] = "custom"; m["starts_at"] = starts; m["ends_at"] = starts }, 422, "ends_at"},
		{"custom ends_at before starts_at", func(m map[string]any) {
			m["period"] = "custom"
			m["starts_at"] = starts
			m["ends_at"] = starts.Add(-time.Second)
		}, 422, "ends_at"},
		{"custom one second", func(m map[string]any) {
			m["period"] = "custom"
			m["starts_at"] = starts
			m["ends_at"] = starts.Add(time.Second)
		}, 201, ""},
		{"project scope without project_id", func(m map[string]any) { m["scope_type"] = "project" }, 422, "project_id"},
		{"tenant scope with project_id", func(m map[string]any) { m["project_id"] = e.acme.DefaultProject.String() }, 422, "project_id"},
		{"bad enforcement mode", func(m map[string]any) { m["enforcement_mode"] = "shout" }, 422, "enforcement_mode"},
		{"bad period", func(m map[string]any) { m["period"] = "weekly" }, 422, "period"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := e.rows("budgets")
			m := valid()
			tc.edit(m)
			raw, _ := json.Marshal(m)
			resp := e.Do(e.Request("POST", "/api/v1/billing/budgets", e.acme.AdminToken, string(raw)))
			defer resp.Body.Close()
			var body struct {
				api.ErrorResponse
				Name string `json:"name"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatalf("status %d, body not JSON: %v", resp.StatusCode, err)
			}
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %+v", resp.StatusCode, tc.status, body)
			}
			after := e.rows("budgets")
			if tc.status != 201 {
				if string(body.Code) != "validation_error" || body.Details["field"] != tc.field {
					t.Fatalf("got %s field %v, want validation_error field %s (%s)", body.Code, body.Details["field"], tc.field, body.Message)
				}
				if after != before {
					t.Fatal("a refused create persisted a budget")
				}
			} else if after != before+1 {
				t.Fatal("create did not persist")
			}
		})
	}

	// PATCH validation: same rules on the merged budget; nothing persists.
	r := e.create(e.admin, createReq(api.BillingBudgetScopeTypeTenant, nil, "patchme", 100, api.BillingBudgetEnforcementModeNotifyOnly))
	id := r.JSON201.ID
	patches := []struct {
		body  string
		field string
	}{
		{`{}`, "body"},
		{`{"threshold_percent":0}`, "threshold_percent"},
		{`{"threshold_percent":101}`, "threshold_percent"},
		{`{"name":""}`, "name"},
		{`{"period":"custom"}`, "ends_at"},
		{`{"ends_at":"2000-01-01T00:00:00Z"}`, "ends_at"},
		{`{"ends_at":"2030-01-01T00:00:00Z","clear_ends_at":true}`, "clear_ends_at"},
		{`{"amount":{"amount_minor":1,"currency":"eur"}}`, "amount.currency"},
		{`{"name":"a","display_name":"b"}`, "display_name"},
	}
	for _, p := range patches {
		resp := e.Do(e.Request("PATCH", "/api/v1/billing/budgets/"+id.String(), e.acme.AdminToken, p.body))
		var body api.ErrorResponse
		err := json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("PATCH %s: %d, body not JSON: %v", p.body, resp.StatusCode, err)
		}
		if resp.StatusCode != 422 || body.Details["field"] != p.field {
			t.Fatalf("PATCH %s: %d %s field %v, want 422 field %s", p.body, resp.StatusCode, body.Code, body.Details["field"], p.field)
		}
	}
	if got := e.list(e.admin, api.ListBillingBudgetsParams{}); got[len(got)-1].Name != "patchme" || got[len(got)-1].ThresholdPercent != 80 {
		t.Fatalf("a refused patch changed the budget: %+v", got[len(got)-1])
	}
	// A custom period made valid in one patch, then its end cleared is refused.
	resp := e.Do(e.Request("PATCH", "/api/v1/billing/budgets/"+id.String(), e.acme.AdminToken,
		`{"period":"custom","starts_at":"2026-01-01T00:00:00Z","ends_at":"2026-02-01T00:00:00Z"}`))
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("custom patch: %d", resp.StatusCode)
	}
	resp = e.Do(e.Request("PATCH", "/api/v1/billing/budgets/"+id.String(), e.acme.AdminToken, `{"clear_ends_at":true}`))
	resp.Body.Close()
	if resp.StatusCode != 422 {
		t.Fatalf("clearing a custom budget's end: %d", resp.StatusCode)
	}
}

// The decision endpoint writes nothing, and its edges: exactly threshold_percent warns,
// exactly 100 % is exceeded (would_block for block_launch/suspend, warn for notify_only).
func TestAPIBudgetDecisionWritesNothing(t *testing.T) {
	e := newAPIEnv(t)
	ctx := context.Background()
	block := e.create(e.admin, createReq(api.BillingBudgetScopeTypeTenant, nil, "block", 100_00, api.BillingBudgetEnforcementModeBlockLaunch)).JSON201
	e.create(e.admin, createReq(api.BillingBudgetScopeTypeTenant, nil, "notify", 100_00, api.BillingBudgetEnforcementModeNotifyOnly))
	e.create(e.owner, createReq(api.BillingBudgetScopeTypeProject, &e.ml, "ml", 50_00, api.BillingBudgetEnforcementModeSuspend))
	// Some events exist, so a decision that wrote would be visible.
	e.spend.set(nil, "USD", 85_00)
	if _, err := e.App.Budgets.Evaluate(ctx, e.acme.ID); err != nil {
		t.Fatal(err)
	}
	tables := []string{"budgets", "budget_events", "outbox_events", "audit_events", "idempotency_keys"}
	counts := func() map[string]int {
		m := map[string]int{}
		for _, tb := range tables {
			m[tb] = e.rows(tb)
		}
		return m
	}
	before := counts()
	// The newest event sighting (none: nil); a decision must not move it.
	lastSeen := func() *time.Time {
		t.Helper()
		var seen *time.Time
		if err := e.Pool.QueryRow(ctx, `SELECT max(last_seen_at) FROM budget_events`).Scan(&seen); err != nil {
			t.Fatal(err)
		}
		return seen
	}
	seen := lastSeen()

	decide := func(c *api.ClientWithResponses, project *uuid.UUID, amount int64, currency string) *api.DecideBillingBudgetHTTPResponse {
		t.Helper()
		r, err := c.DecideBillingBudgetWithResponse(ctx, &api.DecideBillingBudgetParams{}, api.DecideBillingBudgetJSONRequestBody{
			ProjectID: project, ProposedAmount: api.Money{AmountMinor: amount, Currency: currency},
		})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	item := func(r *api.DecideBillingBudgetHTTPResponse, name string) api.BillingBudgetDecisionItem {
		t.Helper()
		for _, it := range r.JSON200.Items {
			if it.DisplayName == name {
				return it
			}
		}
		t.Fatalf("no item %s in %s", name, r.Body)
		return api.BillingBudgetDecisionItem{}
	}

	// Spent 85.00 of 100.00 (threshold 80): proposing 14.99 stays under 100 % -> warn.
	r := decide(e.member, nil, 14_99, "USD")
	if r.StatusCode() != 200 || r.JSON200.Decision != "warn" || len(r.JSON200.Items) != 2 {
		t.Fatalf("under 100 %%: %d %s", r.StatusCode(), r.Body)
	}
	it := item(r, "block")
	if it.Reason != "threshold_crossed" || it.Decision != "warn" || it.PercentUsedBefore != 85 || it.PercentUsedAfter != 99 ||
		it.ProjectedSpend.AmountMinor != 99_99 || it.BudgetPolicyID != block.ID || it.ThresholdPercent != 80 || it.ProjectID != nil {
		t.Fatalf("block item under 100 %%: %+v", it)
	}
	// Exactly 100 %: exceeded. block_launch would block; notify_only only warns.
	r = decide(e.member, nil, 15_00, "USD")
	if r.JSON200.Decision != "would_block" {
		t.Fatalf("exactly 100 %%: %s", r.Body)
	}
	if it := item(r, "block"); it.Reason != "budget_exceeded" || it.Decision != "would_block" || it.PercentUsedAfter != 100 {
		t.Fatalf("block at exactly 100 %%: %+v", it)
	}
	if it := item(r, "notify"); it.Reason != "budget_exceeded" || it.Decision != "warn" {
		t.Fatalf("notify at exactly 100 %%: %+v", it)
	}
	// Exactly at threshold_percent (80 %) from zero spend: threshold_crossed; one cent
	// below: within budget.
	e.spend.set(nil, "USD", 0)
	if it := item(decide(e.member, nil, 80_00, "USD"), "block"); it.Reason != "threshold_crossed" || it.Decision != "warn" {
		t.Fatalf("exactly 80 %%: %+v", it)
	}
	if r := decide(e.member, nil, 79_99, "USD"); r.JSON200.Decision != "allow" || item(r, "block").Reason != "within_budget" {
		t.Fatalf("79.99 %%: %s", r.Body)
	}
	// Another currency adds nothing: the item shows 0 in the budget's currency.
	if it := item(decide(e.member, nil, 1_000_000_00, "EUR"), "block"); it.ProposedAmount != (api.Money{AmountMinor: 0, Currency: "USD"}) || it.Decision != "allow" {
		t.Fatalf("EUR proposal: %+v", it)
	}
	// With a project: the tenant's budgets plus that project's (suspend blocks too).
	e.spend.set(&e.ml, "USD", 49_99)
	r = decide(e.viewer, &e.ml, 1, "USD")
	if r.StatusCode() != 200 || len(r.JSON200.Items) != 3 || r.JSON200.Decision != "would_block" || item(r, "ml").Decision != "would_block" ||
		*item(r, "ml").ProjectID != e.ml {
		t.Fatalf("project decision: %d %s", r.StatusCode(), r.Body)
	}
	// Callers without a role in the project are refused; bad input is 422.
	r = decide(e.member, &e.ml, 1, "USD")
	wantAPIErr(t, r.StatusCode(), r.Body, 403, "insufficient_permissions", "")
	r = decide(e.member, nil, -1, "USD")
	wantAPIErr(t, r.StatusCode(), r.Body, 422, "validation_error", "")
	r = decide(e.member, nil, 1, "usd")
	wantAPIErr(t, r.StatusCode(), r.Body, 422, "validation_error", "")
	// Replaying the same call with an Idempotency-Key stores nothing either: the
	// operation does not take one.
	req := e.Request("POST", "/api/v1/billing/budgets/decision", e.acme.AdminToken, `{"proposed_amount":{"amount_minor":1,"currency":"USD"}}`)
	req.Header.Set("Idempotency-Key", "k1")
	resp := e.Do(req)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("decision with a stray Idempotency-Key: %d", resp.StatusCode)
	}

	after := counts()
	for _, tb := range tables {
		if before[tb] != after[tb] {
			t.Fatalf("%s: %d rows before, %d after the decisions", tb, before[tb], after[tb])
		}
	}
	if seenAfter := lastSeen(); (seen == nil) != (seenAfter == nil) || (seen != nil && !seenAfter.Equal(*seen)) {
		t.Fatalf("a decision touched an event: last seen %v, then %v", seen, seenAfter)
	}
}

func TestAPIBudgetEventsAcknowledgeResolve(t *testing.T) {
	e := newAPIEnv(t)
	ctx := context.Background()
	mlb := e.create(e.owner, createReq(api.BillingBudgetScopeTypeProject, &e.ml, "ml", 100_00, api.BillingBudgetEnforcementModeNotifyOnly)).JSON201
	e.spend.set(&e.ml, "USD", 90_00)
	if _, err := e.App.Budgets.Evaluate(ctx, e.acme.ID); err != nil {
		t.Fatal(err)
	}
	items := e.list(e.viewer, api.ListBillingBudgetsParams{ProjectID: &e.ml})
	if len(items) != 1 || items[0].ID != mlb.ID || items[0].LatestEvent == nil {
		t.Fatalf("posture: %+v", items)
	}
	ev := items[0].LatestEvent
	if ev.Status != "open" || ev.ThresholdKey != "percent_80" || ev.SeenCount != 1 || ev.PercentUsed != 90 ||
		ev.Spent != (api.Money{AmountMinor: 90_00, Currency: "USD"}) || ev.Budget != (api.Money{AmountMinor: 100_00, Currency: "USD"}) {
		t.Fatalf("event: %+v", ev)
	}
	ack := func(c *api.ClientWithResponses, id uuid.UUID) (int, []byte, *api.BillingBudgetEvent) {
		r, err := c.AcknowledgeBillingBudgetEventWithResponse(ctx, id, &api.AcknowledgeBillingBudgetEventParams{})
		if err != nil {
			t.Fatal(err)
		}
		return r.StatusCode(), r.Body, r.JSON200
	}
	resolve := func(c *api.ClientWithResponses, id uuid.UUID) (int, []byte, *api.BillingBudgetEvent) {
		r, err := c.ResolveBillingBudgetEventWithResponse(ctx, id, &api.ResolveBillingBudgetEventParams{})
		if err != nil {
			t.Fatal(err)
		}
		return r.StatusCode(), r.Body, r.JSON200
	}
	st, body, _ := ack(e.viewer, ev.ID)
	wantAPIErr(t, st, body, 403, "insufficient_permissions", "")
	st, body, _ = ack(e.member, ev.ID)
	wantAPIErr(t, st, body, 404, "invalid_request", "not_found")
	st, body, _ = ack(e.outsider, ev.ID)
	wantAPIErr(t, st, body, 404, "invalid_request", "not_found")
	st, body, _ = ack(e.owner, uuid.Must(uuid.NewV7()))
	wantAPIErr(t, st, body, 404, "invalid_request", "not_found")

	audits := e.rows("audit_events WHERE action LIKE 'budget.event.%'")
	st, body, got := ack(e.owner, ev.ID)
	if st != 200 || got.Status != "acknowledged" {
		t.Fatalf("acknowledge: %d %s", st, body)
	}
	st, _, got = ack(e.owner, ev.ID) // again: no change, no audit
	if st != 200 || got.Status != "acknowledged" || e.rows("audit_events WHERE action LIKE 'budget.event.%'") != audits+1 {
		t.Fatalf("acknowledge twice: %d %+v", st, got)
	}
	st, body, got = resolve(e.admin, ev.ID) // tenant admins manage project budgets too
	if st != 200 || got.Status != "resolved" {
		t.Fatalf("resolve: %d %s", st, body)
	}
	st, body, _ = ack(e.owner, ev.ID) // backwards
	wantAPIErr(t, st, body, 409, "invalid_request", "status_transition_not_allowed")
	st, _, got = resolve(e.owner, ev.ID)
	if st != 200 || got.Status != "resolved" {
		t.Fatalf("resolve twice: %d %+v", st, got)
	}
	if n := e.rows("audit_events WHERE action LIKE 'budget.event.%'"); n != audits+2 {
		t.Fatalf("event audit rows: %d, want %d", n, audits+2)
	}
	// Seen again: counted, still resolved.
	if _, err := e.App.Budgets.Evaluate(ctx, e.acme.ID); err != nil {
		t.Fatal(err)
	}
	items = e.list(e.owner, api.ListBillingBudgetsParams{ProjectID: &e.ml})
	if le := items[0].LatestEvent; le.ID != ev.ID || le.Status != "resolved" || le.SeenCount != 2 {
		t.Fatalf("after re-evaluation: %+v", le)
	}
	// open -> resolved directly.
	e.spend.set(&e.ml, "USD", 100_00)
	if _, err := e.App.Budgets.Evaluate(ctx, e.acme.ID); err != nil {
		t.Fatal(err)
	}
	items = e.list(e.owner, api.ListBillingBudgetsParams{ProjectID: &e.ml})
	le := items[0].LatestEvent
	if le.ID == ev.ID || le.ThresholdKey != "percent_100" || le.Status != "open" {
		t.Fatalf("100 %% event: %+v", le)
	}
	if st, body, got := resolve(e.owner, le.ID); st != 200 || got.Status != "resolved" {
		t.Fatalf("open -> resolved: %d %s", st, body)
	}

}

// Wired to billing's real spend (no seam): a fresh tenant has spent nothing.
func TestAPIBudgetDecisionWithBillingSpend(t *testing.T) {
	env := apitest.New(t)
	_, root := env.PlatformAdmin(t)
	acme := env.NewTenant(t, root, "Acme")
	c := env.Client(acme.AdminToken)
	ctx := context.Background()
	r, err := c.CreateBillingBudgetWithResponse(ctx, &api.CreateBillingBudgetParams{},
		createReq(api.BillingBudgetScopeTypeProject, &acme.DefaultProject, "cap", 100_00, api.BillingBudgetEnforcementModeBlockLaunch))
	if err != nil || r.StatusCode() != 201 {
		t.Fatalf("create: %v %s", err, r.Body)
	}
	d, err := c.DecideBillingBudgetWithResponse(ctx, &api.DecideBillingBudgetParams{}, api.DecideBillingBudgetJSONRequestBody{
		ProjectID: &acme.DefaultProject, ProposedAmount: api.Money{AmountMinor: 100_00, Currency: "USD"},
	})
	if err != nil || d.StatusCode() != 200 || len(d.JSON200.Items) != 1 || d.JSON200.Items[0].Spent.AmountMinor != 0 ||
		d.JSON200.Decision != "would_block" {
		t.Fatalf("decision: %v %s", err, d.Body)
	}
	if _, err := env.App.Budgets.Evaluate(ctx, acme.ID); err != nil {
		t.Fatalf("evaluate with billing spend: %v", err)
	}
}
