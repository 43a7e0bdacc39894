package notifications

import (
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
)

func TestChannelsAndSubjects(t *testing.T) {
	user, org := uuid.New(), uuid.New()
	for _, tc := range []struct {
		c       Channel
		name    string
		subject string
	}{
		{UserChannel(user), "user:" + user.String(), "p.user." + user.String()},
		{OrgChannel(org), "org:" + org.String(), "p.org." + org.String()},
		{Broadcast(), "broadcast", "p.broadcast"},
	} {
		if string(tc.c) != tc.name {
			t.Errorf("channel %q, want %q", tc.c, tc.name)
		}
		subj, err := tc.c.subject("p.")
		if err != nil || subj != tc.subject {
			t.Errorf("%s: subject %q %v, want %q", tc.c, subj, err, tc.subject)
		}
		back, ok := channelOfSubject("p.", subj)
		if !ok || back != tc.c {
			t.Errorf("%s: back from %q = %q %v", tc.c, subj, back, ok)
		}
	}
	for _, bad := range []Channel{"", "user:", "user:nope", "org:" + Channel(strings.ToUpper(org.String())), "team:" + Channel(org.String()), "user:" + Channel(uuid.Nil.String())} {
		if _, err := bad.subject("p."); err == nil {
			t.Errorf("channel %q accepted", bad)
		}
	}
	for _, bad := range []string{"p.user", "p.user.x", "p.org.", "q.broadcast", "p.broadcast.x", "p.team." + org.String()} {
		if c, ok := channelOfSubject("p.", bad); ok {
			t.Errorf("subject %q gave channel %q", bad, c)
		}
	}
}

func TestFromEvent(t *testing.T) {
	tenant, project, alloc := uuid.New(), uuid.New(), uuid.New()
	allocation := `{"allocation_id":"` + alloc.String() + `","tenant_id":"` + tenant.String() + `","project_id":"` + project.String() +
		`","node_id":"` + uuid.NewString() + `","sku":"h100.1x","status":"active","from_status":"provisioning","event":"provisioned","task_id":"x"}`
	n, ok := fromEvent("allocation.active", []byte(allocation))
	if !ok || n.Channel != OrgChannel(tenant) || n.Project != project || n.Type != "allocation.active" {
		t.Fatalf("allocation.active -> %+v %v", n, ok)
	}
	want := map[string]any{"allocation_id": alloc.String(), "project_id": project.String(), "status": "active",
		"from_status": "provisioning", "event": "provisioned", "sku": "h100.1x"}
	if len(n.Data) != len(want) {
		t.Errorf("data %v, want exactly %v (no node or task ids)", n.Data, want)
	}
	for k, v := range want {
		if n.Data[k] != v {
			t.Errorf("data[%s] = %v, want %v", k, n.Data[k], v)
		}
	}

	budget := `{"budget_id":"` + uuid.NewString() + `","tenant_id":"` + tenant.String() + `","project_id":null,"scope_type":"tenant",` +
		`"enforcement_mode":"notify_only","active":true,"event_id":"` + uuid.NewString() + `","threshold_key":"80","percent_used":81}`
	n, ok = fromEvent("budget.threshold_crossed", []byte(budget))
	if !ok || n.Channel != OrgChannel(tenant) || n.Project != uuid.Nil || n.Data["threshold_key"] != "80" {
		t.Fatalf("budget.threshold_crossed -> %+v %v", n, ok)
	}
	if _, leaked := n.Data["active"]; leaked {
		t.Error("a field outside the allowlist was copied")
	}

	invoice := `{"invoice_id":"` + uuid.NewString() + `","tenant_id":"` + tenant.String() + `","status":"due","currency":"USD",` +
		`"total_minor":4321,"amount_due_minor":4321,"number":"GNT-000007","period_start":"2026-01-01T00:00:00Z","period_end":"2026-02-01T00:00:00Z","seller_key":"s"}`
	n, ok = fromEvent("invoice.issued", []byte(invoice))
	if !ok || n.Channel != OrgChannel(tenant) || n.Project != uuid.Nil || n.Data["number"] != "GNT-000007" || n.Data["total_minor"] != float64(4321) {
		t.Fatalf("invoice.issued -> %+v %v", n, ok)
	}
	if _, leaked := n.Data["seller_key"]; leaked {
		t.Error("an invoice field outside the allowlist was copied")
	}

	for _, tc := range []struct{ typ, payload string }{
		{"invoice.created", invoice},
		{"invoice.written_off", invoice},
		{"allocation.active", strings.Replace(allocation, `"status":"active"`, `"status":"failed"`, 1)}, // type and status disagree
		{"allocation.active", strings.Replace(allocation, tenant.String(), "nope", 1)},
		{"allocation.active", strings.Replace(allocation, project.String(), "nope", 1)},
		{"allocation.active", `not json`},
		{"budget.created", budget},
		{"budget.threshold_crossed", strings.Replace(budget, tenant.String(), "", 1)},
		{"project.created", `{"tenant_id":"` + tenant.String() + `"}`},
	} {
		if n, ok := fromEvent(tc.typ, []byte(tc.payload)); ok {
			t.Errorf("%s %s became %+v", tc.typ, tc.payload, n)
		}
	}
}

func TestNotificationValidation(t *testing.T) {
	ok := Notification{Channel: OrgChannel(uuid.New()), Type: "maintenance.scheduled", Data: map[string]any{"starts_at": "x"}, Project: uuid.New()}
	if err := ok.validate(); err != nil {
		t.Fatal(err)
	}
	for name, n := range map[string]Notification{
		"secret field":          {Channel: Broadcast(), Type: "x", Data: map[string]any{"nested": map[string]any{"access_token": "t"}}},
		"upper-case type":       {Channel: Broadcast(), Type: "Maintenance"},
		"empty type":            {Channel: Broadcast(), Type: ""},
		"project off org":       {Channel: UserChannel(uuid.New()), Type: "x", Project: uuid.New()},
		"unknown channel":       {Channel: "team:1", Type: "x"},
		"type over 64 chars":    {Channel: Broadcast(), Type: "a" + strings.Repeat("b", 64)},
		"project on broadcast":  {Channel: Broadcast(), Type: "x", Project: uuid.New()},
		"password in data keys": {Channel: Broadcast(), Type: "x", Data: map[string]any{"password": "p"}},
	} {
		if err := n.validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	big := Notification{Channel: Broadcast(), Type: "x", Data: map[string]any{"text": strings.Repeat("a", maxDataBytes)}}
	if _, err := big.encode(time.Now()); err == nil {
		t.Error("a message over the cap was encoded")
	}
}

// A client that lets its queue fill up loses the message (counted) and is told to go:
// the fan-out never waits for it.
func TestSlowClientIsDroppedNotWaitedFor(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	h := &Hub{cfg: Config{SendQueue: 2}, metrics: m, clock: clock.Real{}}
	s := newSubscriber(h, &principal.Principal{UserID: uuid.New()}, time.Time{})
	s.offer(outgoing{body: []byte("1")})
	s.offer(outgoing{body: []byte("2")})
	select {
	case <-s.stopped:
		t.Fatal("stopped before the queue was full")
	default:
	}
	s.offer(outgoing{body: []byte("3")})
	select {
	case <-s.stopped:
	default:
		t.Fatal("a full queue did not stop the connection")
	}
	if s.code != websocket.StatusPolicyViolation {
		t.Errorf("close code %v, want policy violation", s.code)
	}
	s.offer(outgoing{body: []byte("4")}) // after the stop: ignored, not counted again
	if got := testutil.ToFloat64(m.WriteErrors); got != 1 {
		t.Errorf("write errors %v, want 1", got)
	}
	if len(s.queue) != 2 {
		t.Errorf("queue holds %d, want the 2 that fitted", len(s.queue))
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

func TestOriginPolicy(t *testing.T) {
	patterns := []string{"console.example.com", "https://*.example.org"}
	for _, tc := range []struct {
		origin []string
		want   bool
	}{
		{nil, true}, // not a browser
		{[]string{"http://api.gantry.test:8080"}, true}, // the request's own host
		{[]string{"https://console.example.com"}, true},
		{[]string{"http://CONSOLE.example.com"}, true},
		{[]string{"https://app.example.org"}, true},
		{[]string{"http://app.example.org"}, false}, // scheme pattern
		{[]string{"https://evil.example"}, false},
		{[]string{"https://api.gantry.test:8080.evil.example"}, false},
		{[]string{"null"}, false},
		{[]string{"https://console.example.com", "https://console.example.com"}, false},
	} {
		r := httptest.NewRequest(http.MethodGet, "http://api.gantry.test:8080/ws/notifications", nil)
		for _, o := range tc.origin {
			r.Header.Add("Origin", o)
		}
		if got := originAllowed(r, patterns); got != tc.want {
			t.Errorf("origin %v: allowed %v, want %v", tc.origin, got, tc.want)
		}
	}
}

func TestCredentialSources(t *testing.T) {
	req := func(auth string, protocols ...string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/ws/notifications", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		if len(protocols) > 0 {
			r.Header.Set("Sec-WebSocket-Protocol", strings.Join(protocols, ", "))
		}
		return r
	}
	for _, tc := range []struct {
		name   string
		r      *http.Request
		token  string
		code   apierr.Code
		reason string
	}{
		{"header", req("Bearer abc", Subprotocol), "abc", "", ""},
		{"subprotocol", req("", Subprotocol, BearerProtocolPrefix+"a.b.c"), "a.b.c", "", ""},
		{"no v1 subprotocol", req("Bearer abc"), "", apierr.InvalidRequest, "subprotocol_required"},
		{"nothing", req("", Subprotocol), "", apierr.TokenMissing, ""},
		{"both", req("Bearer abc", Subprotocol, BearerProtocolPrefix+"abc"), "", apierr.InvalidRequest, "credentials_ambiguous"},
		{"two subprotocol tokens", req("", BearerProtocolPrefix+"a", Subprotocol, BearerProtocolPrefix+"b"), "", apierr.InvalidRequest, "credentials_ambiguous"},
		{"empty subprotocol token", req("", Subprotocol, BearerProtocolPrefix), "", apierr.TokenInvalid, ""},
	} {
		token, err := credential(tc.r)
		if token != tc.token || apierr.CodeOf(err) != tc.code && tc.code != "" || (tc.code == "" && err != nil) {
			t.Errorf("%s: %q %v, want %q %s", tc.name, token, err, tc.token, tc.code)
			continue
		}
		if e, ok := apierr.As(err); ok && tc.reason != "" && e.Details["reason"] != tc.reason {
			t.Errorf("%s: reason %v, want %s", tc.name, e.Details["reason"], tc.reason)
		}
	}
}

func TestQueryIsRefusedWithoutEchoingIt(t *testing.T) {
	for raw, reason := range map[string]string{
		"access_token=eyJ.x.y": "token_in_query", "token=t": "token_in_query", "jwt=t": "token_in_query",
		"x=1": "query_not_allowed", "%zz": "query_not_allowed",
	} {
		e, _ := apierr.As(queryRefused(raw))
		if e == nil || e.Code != apierr.InvalidRequest || e.Details["reason"] != reason || strings.Contains(e.Message, raw) {
			t.Errorf("%s: %+v, want invalid_request/%s without the query", raw, e, reason)
		}
	}
}

func TestTokenExpiry(t *testing.T) {
	payload := base64.RawURLEncoding.EncodeToString([]byte(`{"exp":1900000000,"sub":"x"}`))
	if got := tokenExpiry("h." + payload + ".s"); !got.Equal(time.Unix(1900000000, 0)) {
		t.Errorf("expiry %v", got)
	}
	for _, bad := range []string{"", "a.b", "h.!!!.s", "h." + base64.RawURLEncoding.EncodeToString([]byte(`{"exp":"soon"}`)) + ".s"} {
		if got := tokenExpiry(bad); !got.IsZero() {
			t.Errorf("%q: expiry %v, want none", bad, got)
		}
	}
}

func TestRecentDropsRepeatsWithinItsWindow(t *testing.T) {
	r := newRecent(2)
	if !r.add("a") || !r.add("b") || r.add("a") {
		t.Fatal("a repeat inside the window was not caught")
	}
	if !r.add("c") || !r.add("a") { // "a" fell out of the window when "c" came
		t.Fatal("the window did not move")
	}
}
