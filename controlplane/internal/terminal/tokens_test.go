package terminal_test

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/terminal"
	nodeterm "github.com/gantry-gpu/gantry/nodeagent/terminal"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

func wantAPIError(t *testing.T, status int, body []byte, wantStatus int, code, reason string) {
	t.Helper()
	var e api.ErrorResponse
	_ = json.Unmarshal(body, &e)
	if status != wantStatus || string(e.Code) != code || (reason != "" && e.Details["reason"] != reason) {
		t.Fatalf("got %d %s/%v, want %d %s/%s: %s", status, e.Code, e.Details["reason"], wantStatus, code, reason, body)
	}
}

// Who may mint: members and up of the allocation's project, for a running allocation.
// Every refusal persists nothing.
func TestMintRefusals(t *testing.T) {
	w := newWorld(t)
	node := w.fakeNode(t)
	active := w.activeAllocation(t, node, nil)
	_, viewer := w.member(t, api.ProjectRoleViewer)
	_, member := w.member(t, api.ProjectRoleMember)

	// Another tenant's user: not a member of acme's project, and acme's allocation is
	// not found in its own project.
	eve := w.NewTenant(t, w.rootToken(t), "Evil")
	eveC := w.Client(eve.AdminToken)

	// A second allocation that is not running yet (requested).
	r, err := w.Alice.CreateAllocationWithResponse(context.Background(), &api.CreateAllocationParams{XProjectID: w.Acme.DefaultProject},
		api.CreateAllocationJSONRequestBody{Name: "pending", Sku: sku1x})
	if err != nil || r.StatusCode() != 201 {
		t.Fatalf("create: %v %s", err, r.Body)
	}
	pending := r.JSON201.ID

	cases := []struct {
		name    string
		c       *api.ClientWithResponses
		project uuid.UUID
		alloc   uuid.UUID
		body    api.TerminalSessionCreateRequest
		status  int
		code    string
		reason  string
	}{
		{"viewer", viewer, w.Acme.DefaultProject, active.ID, api.TerminalSessionCreateRequest{}, 403, "insufficient_permissions", ""},
		{"not running", w.Alice, w.Acme.DefaultProject, pending, api.TerminalSessionCreateRequest{}, 409, "allocation_not_active", ""},
		{"unknown allocation", w.Alice, w.Acme.DefaultProject, uuid.New(), api.TerminalSessionCreateRequest{}, 404, "allocation_not_found", ""},
		{"other tenant in acme's project", eveC, w.Acme.DefaultProject, active.ID, api.TerminalSessionCreateRequest{}, 403, "insufficient_permissions", ""},
		{"other tenant in its own project", eveC, eve.DefaultProject, active.ID, api.TerminalSessionCreateRequest{}, 404, "allocation_not_found", ""},
		{"size too large", w.Alice, w.Acme.DefaultProject, active.ID, api.TerminalSessionCreateRequest{Cols: ptr(1001)}, 422, "validation_error", ""},
		{"unknown session", w.Alice, w.Acme.DefaultProject, active.ID, api.TerminalSessionCreateRequest{SessionID: ptr(uuid.New())}, 422, "validation_error", "session_not_found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := tc.c.CreateTerminalSessionWithResponse(context.Background(), tc.alloc, &api.CreateTerminalSessionParams{XProjectID: tc.project}, tc.body)
			if err != nil {
				t.Fatal(err)
			}
			wantAPIError(t, res.StatusCode(), res.Body, tc.status, tc.code, tc.reason)
			if n := w.count(t, `SELECT count(*) FROM terminal_tokens`); n != 0 {
				t.Fatalf("%d tokens persisted", n)
			}
		})
	}

	// A member may; the token response is not cacheable.
	ok := w.mint(t, member, active.ID, api.TerminalSessionCreateRequest{})
	if ok.StatusCode() != 201 || ok.HTTPResponse.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("member mint: %d %v %s", ok.StatusCode(), ok.HTTPResponse.Header, ok.Body)
	}
	if n := w.count(t, `SELECT count(*) FROM terminal_tokens WHERE allocation_id = $1 AND consumed_at IS NULL
		AND expires_at = created_at + interval '60 seconds'`, active.ID); n != 1 {
		t.Fatalf("member's token rows: %d", n)
	}
}

// Refusals before the upgrade are envelopes with the route and method; the token is
// spent only by a consume or by travelling in a URL.
func TestHandshakeRefusals(t *testing.T) {
	w := newWorld(t, apitest.WithConfig(func(c *app.Config) { c.Terminal.AllowedOrigins = []string{"console.example.com"} }))
	node := w.fakeNode(t)
	a := w.activeAllocation(t, node, nil)
	base := w.Server.URL
	c := w.App.Contract

	t.Run("token in the query string", func(t *testing.T) {
		ts := w.mustMint(t, a.ID, api.TerminalSessionCreateRequest{})
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		_, resp, err := websocket.Dial(ctx, wsURL(base)+"/ws/terminal/"+a.ID.String()+"?token="+ts.Token, &websocket.DialOptions{
			HTTPClient: &http.Client{Transport: checkingTransport{t: t, c: c}}, Subprotocols: []string{terminal.Subprotocol},
		})
		if err == nil {
			t.Fatal("upgraded with a token in the query string")
		}
		envelope(t, resp, 400, "invalid_request", "token_in_query")
		// The token is spent: it travelled in a URL.
		if n := w.count(t, `SELECT count(*) FROM terminal_tokens WHERE session_id = $1 AND consumed_at IS NOT NULL`, ts.SessionID); n != 1 {
			t.Fatal("a token sent in a URL stays usable")
		}
		_, resp, err = dial(t, c, base, a.ID, ts.Token, nil)
		if err == nil {
			t.Fatal("a leaked token opened a terminal")
		}
		envelope(t, resp, 401, "token_invalid", "")
	})

	t.Run("cross-site origin", func(t *testing.T) {
		ts := w.mustMint(t, a.ID, api.TerminalSessionCreateRequest{})
		for _, origin := range []string{"https://evil.example.net", "null", "https://console.example.com.evil.net"} {
			_, resp, err := dial(t, c, base, a.ID, ts.Token, http.Header{"Origin": {origin}})
			if err == nil {
				t.Fatalf("origin %s upgraded", origin)
			}
			envelope(t, resp, 403, "invalid_request", "origin_not_allowed")
		}
		if n := w.count(t, `SELECT count(*) FROM terminal_tokens WHERE session_id = $1 AND consumed_at IS NULL`, ts.SessionID); n != 1 {
			t.Fatal("a refused origin spent the token")
		}
		// An allowed origin passes the origin check (and then meets the offline node:
		// this node has no agent).
		_, resp, err := dial(t, c, base, a.ID, ts.Token, http.Header{"Origin": {"https://console.example.com"}})
		if err == nil {
			t.Fatal("upgraded to a node without an agent")
		}
		envelope(t, resp, 409, "node_offline", "")
	})

	t.Run("no token, two tokens, no terminal protocol", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		for _, tc := range []struct {
			protos []string
			status int
			code   string
		}{
			{[]string{terminal.Subprotocol}, 401, "token_missing"},
			{[]string{terminal.Subprotocol, terminal.TokenSubprotocolPrefix + "a", terminal.TokenSubprotocolPrefix + "b"}, 401, "token_invalid"},
			{[]string{terminal.TokenSubprotocolPrefix + "x"}, 400, "invalid_request"},
			{[]string{terminal.Subprotocol, terminal.TokenSubprotocolPrefix + "not-a-token"}, 401, "token_invalid"},
		} {
			_, resp, err := websocket.Dial(ctx, wsURL(base)+"/ws/terminal/"+a.ID.String(), &websocket.DialOptions{
				HTTPClient: &http.Client{Transport: checkingTransport{t: t, c: c}}, Subprotocols: tc.protos,
			})
			if err == nil {
				t.Fatalf("%v upgraded", tc.protos)
			}
			envelope(t, resp, tc.status, tc.code, "")
		}
	})

	t.Run("not a websocket request", func(t *testing.T) {
		resp := w.Do(w.Request(http.MethodGet, "/ws/terminal/"+a.ID.String(), "", ""))
		defer resp.Body.Close()
		envelope(t, resp, 400, "invalid_request", "websocket_upgrade_required")
	})

	t.Run("token of another allocation", func(t *testing.T) {
		ts := w.mustMint(t, a.ID, api.TerminalSessionCreateRequest{})
		_, resp, err := dial(t, c, base, uuid.New(), ts.Token, nil)
		if err == nil {
			t.Fatal("upgraded")
		}
		envelope(t, resp, 401, "token_invalid", "")
		// Presented at the wrong place, it is spent.
		_, resp, err = dial(t, c, base, a.ID, ts.Token, nil)
		if err == nil {
			t.Fatal("upgraded")
		}
		envelope(t, resp, 401, "token_invalid", "")
	})
}

// Tokens live 60 seconds (by the injected clock): one presented later is token_expired
// and stays unconsumed.
func TestExpiredToken(t *testing.T) {
	clk := clock.NewManual(time.Now())
	w := newWorld(t, apitest.WithOptions(func(o *app.Options) { o.Clock = clk }))
	node := w.fakeNode(t)
	a := w.activeAllocation(t, node, nil)
	ts := w.mustMint(t, a.ID, api.TerminalSessionCreateRequest{})
	if !ts.ExpiresAt.Equal(clk.Now().Add(60 * time.Second)) {
		t.Fatalf("expires_at %v, want now + 60s (%v)", ts.ExpiresAt, clk.Now().Add(60*time.Second))
	}
	clk.Advance(60 * time.Second)
	_, resp, err := dial(t, w.App.Contract, w.Server.URL, a.ID, ts.Token, nil)
	if err == nil {
		t.Fatal("an expired token opened a terminal")
	}
	envelope(t, resp, 401, "token_expired", "")
	if n := w.count(t, `SELECT count(*) FROM terminal_tokens WHERE session_id = $1 AND consumed_at IS NULL`, ts.SessionID); n != 1 {
		t.Fatal("an expired token was consumed")
	}
	if ok, replay := counters(t, w.App); ok != 0 || replay != 0 {
		t.Fatalf("counters ok=%v replay=%v, want 0 0", ok, replay)
	}
}

// Of 50 concurrent WebSockets presenting one token exactly one gets a terminal; the 49
// others are token_invalid, counted as replays.
func TestConcurrentConsumesOfOneToken(t *testing.T) {
	w := newWorld(t)
	runFabric(t, w.App)
	node := w.agentNode(t, w.App, fabricnet.ModeTCP, nodeterm.Options{})
	a := w.activeAllocation(t, node.id, node)
	ts := w.mustMint(t, a.ID, api.TerminalSessionCreateRequest{})

	const n = 50
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		winners  []*term
		statuses = map[int]int{}
	)
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			tm, resp, err := dial(t, w.App.Contract, w.Server.URL, a.ID, ts.Token, nil)
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				winners = append(winners, tm)
				statuses[101]++
				return
			}
			if resp == nil {
				t.Errorf("dial: %v", err)
				return
			}
			var e api.ErrorResponse
			_ = json.NewDecoder(resp.Body).Decode(&e)
			if e.Code != "token_invalid" {
				t.Errorf("loser got %d %s", resp.StatusCode, e.Code)
			}
			statuses[resp.StatusCode]++
		}()
	}
	close(start)
	wg.Wait()
	if len(winners) != 1 || statuses[401] != n-1 {
		t.Fatalf("outcomes %v, want one 101 and %d 401", statuses, n-1)
	}
	winners[0].waitControl("session_ready")
	if ok, replay := counters(t, w.App); ok != 1 || replay != n-1 {
		t.Fatalf("counters ok=%v replay=%v, want 1 and %d", ok, replay, n-1)
	}
	if got := w.count(t, `SELECT count(*) FROM terminal_sessions WHERE allocation_id = $1`, a.ID); got != 1 {
		t.Fatalf("%d sessions, want 1", got)
	}
	if got := node.term.Len(); got != 1 {
		t.Fatalf("%d PTYs on the node, want 1", got)
	}
}
