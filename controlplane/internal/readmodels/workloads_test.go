package readmodels_test

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/readmodels"
)

// Actionability with an injected clock: the pure rule, every recovery condition.
func TestDeriveAgeing(t *testing.T) {
	w := readmodels.DefaultWindows
	since := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		status                     string
		after                      time.Duration
		dismissed                  bool
		required, actionable, live bool
		until                      time.Duration // 0: no actionable_until
	}{
		{"active", time.Hour, false, false, false, true, 0},
		{"released", time.Hour, false, false, false, false, 0},
		{"release_failed", time.Hour, false, true, true, true, 72 * time.Hour},
		{"release_failed", 72*time.Hour - time.Millisecond, false, true, true, true, 72 * time.Hour},
		{"release_failed", 72 * time.Hour, false, true, false, false, 72 * time.Hour}, // aged into history
		{"release_failed", time.Hour, true, true, false, true, 72 * time.Hour},        // dismissed: live, not actionable
		{"restart_failed", 71 * time.Hour, false, true, true, true, 72 * time.Hour},
		{"failed", 23 * time.Hour, false, true, true, true, 24 * time.Hour},
		{"failed", 25 * time.Hour, false, true, false, false, 24 * time.Hour},
	} {
		a := w.Derive("alloc:x", tc.status, since, since.Add(tc.after), tc.dismissed)
		if a.Required != tc.required || a.Actionable != tc.actionable || a.Live != tc.live {
			t.Errorf("%s +%s dismissed=%v: %+v", tc.status, tc.after, tc.dismissed, a)
		}
		if tc.until == 0 && a.Until != nil || tc.until != 0 && (a.Until == nil || !a.Until.Equal(since.Add(tc.until))) {
			t.Errorf("%s: until = %v, want since+%s", tc.status, a.Until, tc.until)
		}
		if tc.required && a.Key != readmodels.AttentionKey("alloc:x", tc.status, since) {
			t.Errorf("%s: key %q", tc.status, a.Key)
		}
	}
}

func wl(t *testing.T, e env, tok string, project uuid.UUID, query string) []map[string]any {
	t.Helper()
	a := e.Call(t, http.MethodGet, "/api/v1/v3/workloads"+query, tok, nil, project.String())
	if a.Status != http.StatusOK {
		t.Fatalf("GET workloads%s: %d %s", query, a.Status, a.Raw)
	}
	return items(a)
}

func names(its []map[string]any) []string {
	out := []string{}
	for _, it := range its {
		out = append(out, it["name"].(string))
	}
	return out
}

// A release_failed workload is actionable for its window, then ages into history but
// keeps action_required; control-plane time decides, not the client's.
func TestWorkloadsActionableAgeing(t *testing.T) {
	e := newEnv(t)
	_, padmin := e.PlatformAdmin(t)
	acme := e.NewTenant(t, padmin, "Acme")
	p := acme.DefaultProject
	now := e.clk.Now()
	rf := e.alloc(t, acme.ID, p, acme.AdminID, "broken", "release_failed", now.Add(-time.Hour), now.Add(-time.Hour))
	e.alloc(t, acme.ID, p, acme.AdminID, "running", "active", now.Add(-2*time.Hour), now.Add(-2*time.Hour))

	its := wl(t, e, acme.AdminToken, p, "?needs_action=true")
	if len(its) != 1 || its[0]["id"] != readmodels.AllocationWorkloadID(rf) {
		t.Fatalf("needs_action=true: %v", names(its))
	}
	it := its[0]
	if it["is_actionable"] != true || it["needs_action"] != true || it["action_required"] != true || it["action_reason"] != "release_failed" {
		t.Fatalf("in its window: %v", it)
	}
	until, _ := time.Parse(time.RFC3339Nano, it["actionable_until"].(string))
	if !until.Equal(now.Add(-time.Hour).Add(readmodels.DefaultWindows.ReleaseFailed)) {
		t.Fatalf("actionable_until = %v", until)
	}
	if got := names(wl(t, e, acme.AdminToken, p, "?scope=live&sort=name_asc")); len(got) != 2 {
		t.Fatalf("live: %v", got)
	}

	e.clk.Advance(readmodels.DefaultWindows.ReleaseFailed) // 1h past the window
	acme.AdminToken = e.Token(t, acme.AdminID)             // the old one expired meanwhile
	a := e.Call(t, http.MethodGet, "/api/v1/v3/workloads/"+url.PathEscape(readmodels.AllocationWorkloadID(rf)), acme.AdminToken, nil, p.String())
	if a.Status != http.StatusOK {
		t.Fatalf("get: %d %s", a.Status, a.Raw)
	}
	it = a.Body["workload"].(map[string]any)
	if it["is_actionable"] != false || it["needs_action"] != false || it["action_required"] != true {
		t.Fatalf("aged: %v", it)
	}
	if got := names(wl(t, e, acme.AdminToken, p, "?scope=history")); len(got) != 1 || got[0] != "broken" {
		t.Fatalf("history: %v", got)
	}
	if got := names(wl(t, e, acme.AdminToken, p, "?scope=live")); len(got) != 1 || got[0] != "running" {
		t.Fatalf("live after ageing: %v", got)
	}
	if got := wl(t, e, acme.AdminToken, p, "?needs_action=true"); len(got) != 0 {
		t.Fatalf("needs_action after ageing: %v", names(got))
	}
}

// Filters, sorts and cursors; bad input is refused with the parameter named; a
// workload of another project is not found.
func TestWorkloadsListFiltersCursorsAndBadInput(t *testing.T) {
	e := newEnv(t)
	_, padmin := e.PlatformAdmin(t)
	acme := e.NewTenant(t, padmin, "Acme")
	p := acme.DefaultProject
	now := e.clk.Now()
	bobID, bobTok := e.NewUser(t, acme.AdminToken, "member")
	e.member(t, p, bobID, "viewer")
	for i, n := range []string{"e", "c", "a", "d", "b"} {
		owner := acme.AdminID
		if n == "d" {
			owner = bobID
		}
		e.alloc(t, acme.ID, p, owner, n, "active", now.Add(time.Duration(i)*time.Minute), now)
	}
	other := e.NewTenant(t, padmin, "Other")
	theirs := e.alloc(t, other.ID, other.DefaultProject, other.AdminID, "x", "active", now, now)

	// Newest first by default, paged by 2 with cursors.
	var all []string
	q := "?page_size=2"
	for range 4 {
		a := e.Call(t, http.MethodGet, "/api/v1/v3/workloads"+q, bobTok, nil, p.String())
		if a.Status != http.StatusOK {
			t.Fatalf("%d %s", a.Status, a.Raw)
		}
		all = append(all, names(items(a))...)
		next, _ := a.Body["pagination"].(map[string]any)["next_cursor"].(string)
		if next == "" {
			break
		}
		q = "?page_size=2&cursor=" + url.QueryEscape(next)
		// A cursor is bound to its sort.
		if b := e.Call(t, http.MethodGet, "/api/v1/v3/workloads?sort=name_asc&cursor="+url.QueryEscape(next), bobTok, nil, p.String()); b.Status != http.StatusBadRequest {
			t.Fatalf("cursor under another sort: %d %s", b.Status, b.Raw)
		}
	}
	if got := join(all); got != "b,d,a,c,e" {
		t.Fatalf("created_at_desc pages = %s", got)
	}
	if got := join(names(wl(t, e, bobTok, p, "?sort=name_asc"))); got != "a,b,c,d,e" {
		t.Fatalf("name_asc = %s", got)
	}
	if got := join(names(wl(t, e, bobTok, p, "?sort=name_desc&page_size=3"))); got != "e,d,c" {
		t.Fatalf("name_desc = %s", got)
	}
	if got := join(names(wl(t, e, bobTok, p, "?owner_user_id="+bobID.String()))); got != "d" {
		t.Fatalf("owner filter = %s", got)
	}
	if got := wl(t, e, bobTok, p, "?status=released"); len(got) != 0 {
		t.Fatalf("status filter: %v", names(got))
	}
	if got := wl(t, e, bobTok, p, "?kind=jupyter"); len(got) != 0 {
		t.Fatalf("kind filter: %v", names(got))
	}
	// The summary carries the cost projection from the billing engine.
	it := wl(t, e, bobTok, p, "?sort=name_asc&page_size=1")[0]
	cp := it["cost_projection"].(map[string]any)
	if it["hourly_rate"].(map[string]any)["amount_minor"] != 250.0 || cp["currency"] != "USD" || cp["period_end"] == nil {
		t.Fatalf("cost projection: %v / %v", it["hourly_rate"], cp)
	}

	for _, tc := range []struct{ query, field string }{
		{"?status=exploded", "status"},
		{"?kind=spaceship", "kind"},
		{"?scope=everything", "scope"},
		{"?sort=size_desc", "sort"},
		{"?page_size=0", "page_size"},
		{"?page_size=201", "page_size"},
		{"?needs_action=perhaps", "needs_action"},
		{"?owner_user_id=bob", "owner_user_id"},
	} {
		a := e.Call(t, http.MethodGet, "/api/v1/v3/workloads"+tc.query, bobTok, nil, p.String())
		if a.Status != http.StatusUnprocessableEntity || a.Code() != "validation_error" || !containsField(a, tc.field) {
			t.Errorf("%s: %d %s", tc.query, a.Status, a.Raw)
		}
	}
	if a := e.Call(t, http.MethodGet, "/api/v1/v3/workloads", bobTok, nil, ""); a.Status != http.StatusBadRequest || a.Code() != "invalid_request" {
		t.Errorf("no project: %d %s", a.Status, a.Raw)
	}
	a := e.Call(t, http.MethodGet, "/api/v1/v3/workloads/"+url.PathEscape(readmodels.AllocationWorkloadID(theirs)), acme.AdminToken, nil, p.String())
	if a.Status != http.StatusNotFound || a.Code() != "allocation_not_found" {
		t.Errorf("another project's workload: %d %s", a.Status, a.Raw)
	}
	if a = e.Call(t, http.MethodGet, "/api/v1/v3/workloads/nonsense", acme.AdminToken, nil, p.String()); a.Status != http.StatusNotFound {
		t.Errorf("a malformed workload id: %d %s", a.Status, a.Raw)
	}
	// A project the caller is not in is refused before anything is read.
	if a = e.Call(t, http.MethodGet, "/api/v1/v3/workloads", bobTok, nil, other.DefaultProject.String()); a.Status != http.StatusForbidden {
		t.Errorf("another tenant's project: %d %s", a.Status, a.Raw)
	}
}

func join(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += ","
		}
		out += x
	}
	return out
}
