package notifications_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/notifications"
)

// Every refusal of GET /ws/notifications (401, 403) is audited once as auth.denied,
// named after the route and keyed by the client address (no refusal comes after the
// token is verified); other refusals (400, 429) are not denials. A 401 challenges the
// bearer scheme, with error="invalid_token" only when a token was sent, in the
// Authorization header or in the gantry.bearer.<token> subprotocol (which the server's
// error mapper cannot see).
func TestRefusalsAreAuditedWithTheirChallenge(t *testing.T) {
	e := newEnv(t, apitest.WithOptions(func(o *app.Options) {
		o.Notifications = &notifications.Config{AllowedOrigins: []string{"https://console.example.com"}}
	}))
	_, tok := e.PlatformAdmin(t)
	const (
		bare    = `Bearer realm="gantry"`
		invalid = `Bearer realm="gantry", error="invalid_token"`
	)
	subprotocolToken := map[string]string{"Sec-WebSocket-Protocol": notifications.Subprotocol + ", " + notifications.BearerProtocolPrefix + "nope"}
	var missingCorr string
	for _, tc := range []struct {
		name      string
		headers   map[string]string
		times     int
		status    int
		code      string
		challenge string
	}{
		{"no token", nil, 2, 401, "token_missing", bare},
		{"bad subprotocol token", subprotocolToken, 3, 401, "token_invalid", invalid},
		{"bad header token", map[string]string{"Authorization": "Bearer nope.nope.nope"}, 1, 401, "token_invalid", invalid},
		{"cross-site origin", map[string]string{"Authorization": "Bearer " + tok, "Origin": "https://evil.example"}, 1, 403, "insufficient_permissions", ""},
		{"not a handshake", map[string]string{"Authorization": "Bearer " + tok, "Upgrade": ""}, 1, 400, "invalid_request", ""},
	} {
		for range tc.times {
			resp := e.Do(handshake(e, notifications.Route, tc.headers))
			got := resp.Header.Values("WWW-Authenticate")
			if tc.challenge == "" && len(got) != 0 || tc.challenge != "" && (len(got) != 1 || got[0] != tc.challenge) {
				t.Fatalf("%s: WWW-Authenticate %q, want %q", tc.name, got, tc.challenge)
			}
			if tc.code == "token_missing" && missingCorr == "" {
				missingCorr = resp.Header.Get("X-Request-Id")
			}
			wantRefused(t, resp, tc.status, tc.code, "")
		}
	}

	ctx := context.Background()
	if err := e.App.Denials.FlushAll(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := e.Pool.Query(ctx, `SELECT actor_type, actor_user_id IS NULL, correlation_id, metadata
		FROM audit_events WHERE action = 'auth.denied' AND result = 'failure' AND target_id = $1`, "GET "+notifications.Route)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]map[string]any{}
	for rows.Next() {
		var actorType, corr string
		var anonymous bool
		var raw []byte
		var meta map[string]any
		if err := rows.Scan(&actorType, &anonymous, &corr, &raw); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, &meta); err != nil {
			t.Fatal(err)
		}
		if actorType != "user" || !anonymous || meta["ip"] != "127.0.0.1" || meta["operation_id"] != "connectNotifications" || meta["route"] != notifications.Route {
			t.Fatalf("row: %s anonymous=%v %+v", actorType, anonymous, meta)
		}
		code := meta["code"].(string)
		if _, dup := got[code]; dup {
			t.Fatalf("two rows for %s", code)
		}
		if code == "token_missing" && corr != missingCorr {
			t.Fatalf("token_missing row correlation %s, want the first refusal's %s", corr, missingCorr)
		}
		got[code] = meta
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := map[string][2]float64{"token_missing": {2, 401}, "token_invalid": {4, 401}, "insufficient_permissions": {1, 403}}
	if len(got) != len(want) {
		t.Fatalf("rows %v, want one for each of %v", got, want)
	}
	for code, w := range want {
		if m := got[code]; m["count"] != w[0] || m["status"] != w[1] {
			t.Fatalf("%s row: %+v, want count %v status %v", code, m, w[0], w[1])
		}
	}
}
