package notifications_test

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/budgets"
	"github.com/gantry-gpu/gantry/controlplane/internal/notifications"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/clock"
)

// spendOf is a SpendSource that reports the same spend for every budget.
type spendOf int64

func (s spendOf) Spent(context.Context, uuid.UUID, *uuid.UUID, string, time.Time, time.Time) (int64, error) {
	return int64(s), nil
}

// crossBudget makes a tenant-scoped budget of Acme cross its 80% threshold and has the
// relay publish the event.
func (w *world) crossBudget(t *testing.T) budgets.Budget {
	t.Helper()
	ctx := context.Background()
	admin := &principal.Principal{UserID: w.Acme.AdminID, TenantID: w.Acme.ID, TenantRole: principal.TenantRoleAdmin}
	threshold, mode := 80, budgets.ModeNotifyOnly
	ps, err := w.App.Budgets.Create(ctx, admin, budgets.NewBudget{
		ScopeType: budgets.ScopeTenant, Name: "monthly", Period: budgets.PeriodMonthly,
		Amount: budgets.Money{AmountMinor: 10_000, Currency: "USD"}, ThresholdPercent: &threshold, EnforcementMode: &mode,
	})
	if err != nil {
		t.Fatalf("create budget: %v", err)
	}
	w.App.Budgets.Spend = spendOf(8_500)
	if ev, err := w.App.Budgets.EvaluateAll(ctx); err != nil || ev.Opened != 1 {
		t.Fatalf("evaluate: %+v %v", ev, err)
	}
	drain(t, w.Env)
	return ps.Budget
}

func metric(t *testing.T, e *apitest.Env, name string) float64 {
	t.Helper()
	m := e.App.Notifications.Metrics()
	switch name {
	case "active":
		return testutil.ToFloat64(m.Active)
	case "forwarded":
		return testutil.ToFloat64(m.Forwarded)
	case "write_errors":
		return testutil.ToFloat64(m.WriteErrors)
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// Allocation status changes reach the users of the allocation's project in its tenant,
// and no one else: not a member of the same tenant outside the project, not another
// tenant. Budget events reach the whole tenant, a user channel only its user, and a
// broadcast everyone. The counters follow.
func TestNotificationsReachTheRightUsersAndNotOthers(t *testing.T) {
	e := newEnv(t)
	w := newWorld(t, e)
	ctx := context.Background()

	alice := dial(t, e, w.Acme.AdminToken) // browser style: token in a subprotocol
	carol := dial(t, e, w.CarolToken)
	bob, resp, err := dialWith(e, &websocket.DialOptions{ // non-browser: Authorization header
		Subprotocols: []string{notifications.Subprotocol},
		HTTPHeader:   http.Header{"Authorization": {"Bearer " + w.BobToken}},
	})
	if err != nil {
		t.Fatalf("dial bob: %v", err)
	}
	t.Cleanup(func() { _ = bob.CloseNow() })
	if got := resp.Header.Values("Sec-WebSocket-Protocol"); len(got) != 1 || got[0] != notifications.Subprotocol || alice.Subprotocol() != notifications.Subprotocol {
		t.Fatalf("echoed subprotocols %v / %q, want only %s", got, alice.Subprotocol(), notifications.Subprotocol)
	}
	if got := metric(t, e, "active"); got != 3 {
		t.Fatalf("active connections %v, want 3", got)
	}

	alloc := w.launch(t)
	budget := w.crossBudget(t)
	noticeID := uuid.NewString()
	if err := e.App.Notifications.Publish(ctx, notifications.Notification{
		Channel: notifications.UserChannel(w.CarolID), Type: "account.notice", Data: map[string]any{"notice_id": noticeID},
	}); err != nil {
		t.Fatal(err)
	}
	if err := e.App.Notifications.Broadcast(ctx, "platform.maintenance", map[string]any{"window_id": "w-1"}); err != nil {
		t.Fatal(err)
	}
	id := sendBarrier(t, e)

	got := map[string][]notifications.Message{
		"alice": untilBarrier(t, alice, id), "carol": untilBarrier(t, carol, id), "bob": untilBarrier(t, bob, id),
	}
	want := map[string][]string{
		"alice": {"allocation.requested", "budget.threshold_crossed", "platform.maintenance"},
		"carol": {"budget.threshold_crossed", "account.notice", "platform.maintenance"}, // not in the project
		"bob":   {"platform.maintenance"},                                               // another tenant
	}
	for who, ms := range got {
		if !slices.Equal(types(ms), want[who]) {
			t.Errorf("%s got %v, want %v", who, types(ms), want[who])
		}
	}
	org := notifications.OrgChannel(w.Acme.ID)
	if a := got["alice"]; len(a) == 3 {
		m := a[0]
		if m.Channel != org || m.Data["allocation_id"] != alloc.ID.String() || m.Data["project_id"] != w.Acme.DefaultProject.String() ||
			m.Data["status"] != "requested" {
			t.Errorf("allocation message %+v", m)
		}
		for _, k := range []string{"node_id", "task_id", "tenant_id"} {
			if _, ok := m.Data[k]; ok {
				t.Errorf("allocation message carries %s: %+v", k, m.Data)
			}
		}
		if b := a[1]; b.Channel != org || b.Data["budget_id"] != budget.ID.String() || b.Data["threshold_key"] == nil {
			t.Errorf("budget message %+v", b)
		}
		if a[2].Channel != notifications.Broadcast() || a[2].Data["window_id"] != "w-1" {
			t.Errorf("broadcast %+v", a[2])
		}
	}
	if c := got["carol"]; len(c) == 3 && (c[1].Channel != notifications.UserChannel(w.CarolID) || c[1].Data["notice_id"] != noticeID) {
		t.Errorf("user message %+v", c[1])
	}

	// 7 messages and 3 barriers written, nothing lost.
	eventually(t, "10 forwarded messages", func() bool { return metric(t, e, "forwarded") == 10 })
	if got := metric(t, e, "write_errors"); got != 0 {
		t.Errorf("write errors %v", got)
	}
	if err := carol.Close(websocket.StatusNormalClosure, "bye"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "2 active connections after carol left", func() bool { return metric(t, e, "active") == 2 })

	res := e.Do(e.Request(http.MethodGet, "/metrics", "", ""))
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, line := range []string{
		"ws_notifications_active_connections 2", "ws_notifications_forwarded_messages_total 10", "ws_notifications_write_errors_total 0",
		`api_http_requests_total{code="101",method="GET",route="/ws/notifications"} 3`,
	} {
		if !strings.Contains(string(body), line+"\n") {
			t.Errorf("/metrics lacks %q", line)
		}
	}
	_ = alice.Close(websocket.StatusNormalClosure, "")
	_ = bob.Close(websocket.StatusNormalClosure, "")
	eventually(t, "no active connection", func() bool { return metric(t, e, "active") == 0 })
}

// Two control-plane replicas on one database and one NATS: a client on either replica
// gets what is published on the other, still only what is theirs.
func TestNotificationsCrossReplicas(t *testing.T) {
	e1 := newEnv(t, apitest.WithConfig(func(c *app.Config) { c.Fabric.ReplicaID = "replica-1" }))
	w := newWorld(t, e1)
	e2 := newEnv(t,
		apitest.WithOptions(func(o *app.Options) { o.Pool = e1.Pool }),
		apitest.WithConfig(func(c *app.Config) {
			c.EventsStream, c.EventsSubjectPrefix = e1.App.Config.EventsStream, e1.App.Config.EventsSubjectPrefix
			c.Fabric.ReplicaID = "replica-2"
		}))

	alice := dial(t, e2, w.Acme.AdminToken)
	bob := dial(t, e2, w.BobToken)
	carol := dial(t, e1, w.CarolToken)

	// Published on replica 1: the outbox relay's event and a broadcast.
	alloc := w.launch(t)
	if err := e1.App.Notifications.Broadcast(context.Background(), "platform.maintenance", nil); err != nil {
		t.Fatal(err)
	}
	id := sendBarrier(t, e1)
	a, b := untilBarrier(t, alice, id), untilBarrier(t, bob, id)
	if !slices.Equal(types(a), []string{"allocation.requested", "platform.maintenance"}) || a[0].Data["allocation_id"] != alloc.ID.String() {
		t.Errorf("alice on replica 2 got %v", a)
	}
	if !slices.Equal(types(b), []string{"platform.maintenance"}) {
		t.Errorf("bob on replica 2 got %v", types(b))
	}
	if c := untilBarrier(t, carol, id); !slices.Equal(types(c), []string{"platform.maintenance"}) {
		t.Errorf("carol on replica 1 got %v", types(c))
	}

	// Published on replica 2, for a user connected to replica 1 only.
	if err := e2.App.Notifications.Publish(context.Background(), notifications.Notification{
		Channel: notifications.UserChannel(w.CarolID), Type: "account.notice", Data: map[string]any{"n": 1},
	}); err != nil {
		t.Fatal(err)
	}
	id = sendBarrier(t, e2)
	if c := untilBarrier(t, carol, id); !slices.Equal(types(c), []string{"account.notice"}) {
		t.Errorf("carol on replica 1 got %v from replica 2", types(c))
	}
	if a := untilBarrier(t, alice, id); len(a) != 0 {
		t.Errorf("alice got %v", types(a))
	}
	if got1, got2 := metric(t, e1, "active"), metric(t, e2, "active"); got1 != 1 || got2 != 2 {
		t.Errorf("active connections %v and %v, want 1 and 2", got1, got2)
	}
}

// Everything refused before the upgrade is an ErrorResponse with the route and method,
// checked against the contract by the harness's client.
func TestRefusedBeforeTheUpgrade(t *testing.T) {
	e := newEnv(t, apitest.WithOptions(func(o *app.Options) {
		o.Notifications = &notifications.Config{AllowedOrigins: []string{"https://console.example.com"}, MaxConnectionsPerUser: 2}
	}))
	_, tok := e.PlatformAdmin(t)
	bearer := "Bearer " + tok
	path := notifications.Route
	for _, tc := range []struct {
		name    string
		path    string
		headers map[string]string
		status  int
		code    string
		reason  string
	}{
		{"token in the query string", path + "?access_token=" + tok, map[string]string{"Authorization": bearer}, 400, "invalid_request", "token_in_query"},
		{"token in the query string only", path + "?token=" + tok, nil, 400, "invalid_request", "token_in_query"},
		{"any query string", path + "?debug=1", map[string]string{"Authorization": bearer}, 400, "invalid_request", "query_not_allowed"},
		{"no token", path, nil, 401, "token_missing", ""},
		{"bad header token", path, map[string]string{"Authorization": "Bearer nope.nope.nope"}, 401, "token_invalid", ""},
		{"bad subprotocol token", path, map[string]string{"Sec-WebSocket-Protocol": notifications.Subprotocol + ", " + notifications.BearerProtocolPrefix + "nope"}, 401, "token_invalid", ""},
		{"token twice", path, map[string]string{"Authorization": bearer, "Sec-WebSocket-Protocol": notifications.Subprotocol + ", " + notifications.BearerProtocolPrefix + tok}, 400, "invalid_request", "credentials_ambiguous"},
		{"cross-site origin", path, map[string]string{"Authorization": bearer, "Origin": "https://evil.example"}, 403, "insufficient_permissions", "origin_not_allowed"},
		{"no notifications subprotocol", path, map[string]string{"Authorization": bearer, "Sec-WebSocket-Protocol": ""}, 400, "invalid_request", "subprotocol_required"},
		{"not a WebSocket handshake", path, map[string]string{"Authorization": bearer, "Upgrade": ""}, 400, "invalid_request", "websocket_handshake_required"},
		{"wrong WebSocket version", path, map[string]string{"Authorization": bearer, "Sec-WebSocket-Version": "8"}, 400, "invalid_request", "websocket_handshake_required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantRefused(t, e.Do(handshake(e, tc.path, tc.headers)), tc.status, tc.code, tc.reason)
		})
	}

	// Allowed: the configured origin and the server's own.
	var open []*websocket.Conn
	for _, origin := range []string{"https://console.example.com", e.Server.URL} {
		c, _, err := dialWith(e, &websocket.DialOptions{
			Subprotocols: []string{notifications.Subprotocol, notifications.BearerProtocolPrefix + tok},
			HTTPHeader:   http.Header{"Origin": {origin}},
		})
		if err != nil {
			t.Fatalf("origin %s refused: %v", origin, err)
		}
		t.Cleanup(func() { _ = c.CloseNow() })
		open = append(open, c)
	}
	// Two sockets are open: a third is over the cap, until one closes.
	wantRefused(t, e.Do(handshake(e, path, map[string]string{"Authorization": bearer})), 429, "rate_limit_exceeded", "too_many_connections")
	if got := metric(t, e, "active"); got != 2 {
		t.Fatalf("active connections %v after the refusals, want 2", got)
	}
	_ = open[0].Close(websocket.StatusNormalClosure, "")
	eventually(t, "the closed socket is gone", func() bool { return metric(t, e, "active") == 1 })
	dial(t, e, tok).CloseNow()
	open[1].CloseNow()
}

// A socket lives no longer than its token: an expired token is refused at the door, and
// an open socket whose token expires is closed (1008) instead of getting more messages.
func TestExpiredToken(t *testing.T) {
	clk := clock.NewManual(time.Now())
	e := newEnv(t, apitest.WithOptions(func(o *app.Options) { o.Clock = clk }))
	_, tok := e.PlatformAdmin(t)
	c := dial(t, e, tok)
	id := sendBarrier(t, e)
	if got := untilBarrier(t, c, id); len(got) != 0 {
		t.Fatalf("unexpected %v", types(got))
	}

	clk.Advance(e.App.Config.Auth.AccessTokenTTL + time.Hour)
	if err := e.App.Notifications.Broadcast(context.Background(), "platform.maintenance", nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if _, data, err := c.Read(ctx); websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Fatalf("after expiry: %s %v, want a 1008 close", data, err)
	}
	eventually(t, "the expired socket is gone", func() bool { return metric(t, e, "active") == 0 })
	if got := metric(t, e, "forwarded"); got != 1 { // the barrier only
		t.Errorf("forwarded %v, want 1", got)
	}
	wantRefused(t, e.Do(handshake(e, notifications.Route, map[string]string{"Authorization": "Bearer " + tok})), 401, "token_expired", "")
}

// Clients send nothing but small text pings: a ping is answered, anything large closes
// the socket (1009), anything else is a policy violation (1008).
func TestWhatClientsMaySend(t *testing.T) {
	e := newEnv(t)
	_, tok := e.PlatformAdmin(t)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	c := dial(t, e, tok)
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"ping"}`)); err != nil {
		t.Fatal(err)
	}
	if _, data, err := c.Read(ctx); err != nil || string(data) != `{"type":"pong"}` {
		t.Fatalf("ping answered with %s %v", data, err)
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"subscribe","channel":"broadcast"}`)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Read(ctx); websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Fatalf("after a non-ping: %v, want 1008", err)
	}

	c = dial(t, e, tok)
	_ = c.Write(ctx, websocket.MessageText, []byte(`{"type":"ping","pad":"`+strings.Repeat("x", 64<<10)+`"}`))
	if _, _, err := c.Read(ctx); websocket.CloseStatus(err) != websocket.StatusMessageTooBig {
		t.Fatalf("after 64 KiB: %v, want 1009", err)
	}
	eventually(t, "both sockets closed", func() bool { return metric(t, e, "active") == 0 })
}
