package terminal_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/coder/websocket"
	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/terminal"
	"github.com/gantry-gpu/gantry/proto/api"
)

// deniedRow is one auth.denied audit row as stored.
type deniedRow struct {
	ActorType   string
	ActorUserID *uuid.UUID
	ProjectID   *uuid.UUID
	Correlation string
	Meta        map[string]any
}

// deniedRows writes every open denial aggregate and reads the rows of target
// ("GET <route>"), keyed by actor ("ip" or the user id) and code.
func (w *world) deniedRows(t *testing.T, target string) map[string]deniedRow {
	t.Helper()
	ctx := context.Background()
	if err := w.App.Denials.FlushAll(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := w.Pool.Query(ctx, `SELECT actor_type, actor_user_id, project_id, correlation_id, metadata
		FROM audit_events WHERE action = 'auth.denied' AND result = 'failure' AND target_id = $1`, target)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]deniedRow{}
	for rows.Next() {
		var r deniedRow
		var meta []byte
		if err := rows.Scan(&r.ActorType, &r.ActorUserID, &r.ProjectID, &r.Correlation, &meta); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(meta, &r.Meta); err != nil {
			t.Fatal(err)
		}
		actor := "ip"
		if r.ActorUserID != nil {
			actor = r.ActorUserID.String()
		}
		key := actor + " " + r.Meta["code"].(string)
		if _, dup := out[key]; dup {
			t.Fatalf("two rows for %s on %s", key, target)
		}
		out[key] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// wantRow checks one aggregate: how many denials it counts, its status, where from.
func wantRow(t *testing.T, rows map[string]deniedRow, key, actorType string, count, status float64) deniedRow {
	t.Helper()
	r, ok := rows[key]
	if !ok {
		t.Fatalf("no auth.denied row for %s; rows: %+v", key, rows)
	}
	if r.ActorType != actorType || r.Meta["count"] != count || r.Meta["status"] != status || r.Meta["ip"] != "127.0.0.1" {
		t.Fatalf("row %s: %s %+v, want actor type %s, count %v, status %v, ip 127.0.0.1", key, r.ActorType, r.Meta, actorType, count, status)
	}
	return r
}

// refuse dials /ws/terminal/{alloc} offering protocols and returns the refusal.
func (w *world) refuse(t *testing.T, alloc uuid.UUID, protocols []string, header http.Header) *http.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, wsURL(w.Server.URL)+"/ws/terminal/"+alloc.String(), &websocket.DialOptions{
		HTTPClient: &http.Client{Transport: checkingTransport{t: t, c: w.App.Contract}}, HTTPHeader: header, Subprotocols: protocols,
	})
	if err == nil {
		_ = ws.CloseNow()
		t.Fatal("upgraded")
	}
	if resp == nil {
		t.Fatalf("no response: %v", err)
	}
	return resp
}

func wantChallenge(t *testing.T, resp *http.Response, want string) {
	t.Helper()
	if got := resp.Header.Values("WWW-Authenticate"); want == "" && len(got) != 0 || want != "" && (len(got) != 1 || got[0] != want) {
		t.Fatalf("%d: WWW-Authenticate %q, want %q", resp.StatusCode, got, want)
	}
}

const (
	challengeBare    = `Bearer realm="gantry"`
	challengeInvalid = `Bearer realm="gantry", error="invalid_token"`
)

// Every refusal of the terminal's WebSocket operations before the upgrade is audited
// once as auth.denied, named after the route: a token this service issued (spent,
// expired, or sent for another allocation) is its owner's denial, in the project of
// its allocation; anything else is the client address's. A 401 challenges the bearer
// scheme, with error="invalid_token" only when a token was offered (in the
// subprotocol: the server's mapper cannot see that one).
func TestHandshakeDenialsAreAudited(t *testing.T) {
	w := newWorld(t)
	node := w.fakeNode(t)
	a := w.activeAllocation(t, node, nil)
	b := w.activeAllocation(t, node, nil)

	// No token offered: token_missing, the bare challenge.
	resp := w.refuse(t, a.ID, []string{terminal.Subprotocol}, nil)
	envelope(t, resp, 401, "token_missing", "")
	wantChallenge(t, resp, challengeBare)
	missingCorr := resp.Header.Get("X-Request-Id")

	// Garbage tokens, three times: token_invalid from the address.
	for range 3 {
		_, resp, err := dial(t, w.App.Contract, w.Server.URL, a.ID, "not-a-token", nil)
		if err == nil {
			t.Fatal("garbage token upgraded")
		}
		envelope(t, resp, 401, "token_invalid", "")
		wantChallenge(t, resp, challengeInvalid)
	}

	// Alice's token presented for another allocation (spent), then again for its own
	// (replayed): both are alice's.
	ts := w.mustMint(t, a.ID, api.TerminalSessionCreateRequest{})
	var alice uuid.UUID
	if err := w.Pool.QueryRow(context.Background(), `SELECT user_id FROM terminal_tokens WHERE session_id = $1`, ts.SessionID).Scan(&alice); err != nil {
		t.Fatal(err)
	}
	for _, alloc := range []uuid.UUID{b.ID, a.ID} {
		_, resp, err := dial(t, w.App.Contract, w.Server.URL, alloc, ts.Token, nil)
		if err == nil {
			t.Fatal("spent token upgraded")
		}
		envelope(t, resp, 401, "token_invalid", "")
		wantChallenge(t, resp, challengeInvalid)
	}

	// An expired token of alice's.
	old := w.mustMint(t, a.ID, api.TerminalSessionCreateRequest{})
	if _, err := w.Pool.Exec(context.Background(), `UPDATE terminal_tokens SET created_at = created_at - interval '1 hour',
		expires_at = expires_at - interval '1 hour' WHERE session_id = $1`, old.SessionID); err != nil {
		t.Fatal(err)
	}
	_, resp, err := dial(t, w.App.Contract, w.Server.URL, a.ID, old.Token, nil)
	if err == nil {
		t.Fatal("expired token upgraded")
	}
	envelope(t, resp, 401, "token_expired", "")
	wantChallenge(t, resp, challengeInvalid)

	// A cross-site origin: 403, no challenge, the token stays unspent.
	fresh := w.mustMint(t, a.ID, api.TerminalSessionCreateRequest{})
	_, resp, err = dial(t, w.App.Contract, w.Server.URL, a.ID, fresh.Token, http.Header{"Origin": {"https://evil.example.net"}})
	if err == nil {
		t.Fatal("cross-site origin upgraded")
	}
	envelope(t, resp, 403, "invalid_request", "origin_not_allowed")
	wantChallenge(t, resp, "")

	// The relay between replicas: without a token, then with a forged one.
	relay := w.Server.URL + "/api/v1/internal/terminal/relay/" + a.ID.String()
	for _, tc := range []struct{ auth, code, challenge string }{
		{"", "token_missing", challengeBare},
		{"Bearer forged.token", "token_invalid", challengeInvalid},
	} {
		req, _ := http.NewRequest(http.MethodGet, relay, nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 401 {
			t.Fatalf("relay %q: %d, want 401", tc.auth, resp.StatusCode)
		}
		wantChallenge(t, resp, tc.challenge)
	}

	rows := w.deniedRows(t, "GET "+terminal.RouteTerminal)
	if len(rows) != 5 {
		t.Fatalf("%d auth.denied rows on the terminal route, want 5: %+v", len(rows), rows)
	}
	if r := wantRow(t, rows, "ip token_missing", "user", 1, 401); r.Correlation != missingCorr || r.Meta["operation_id"] != "openTerminal" || r.Meta["route"] != terminal.RouteTerminal {
		t.Fatalf("token_missing row: %s %+v, want correlation %s, operation openTerminal", r.Correlation, r.Meta, missingCorr)
	}
	wantRow(t, rows, "ip token_invalid", "user", 3, 401)
	wantRow(t, rows, "ip invalid_request", "user", 1, 403)
	for _, key := range []string{alice.String() + " token_invalid", alice.String() + " token_expired"} {
		count := 1.0
		if key == alice.String()+" token_invalid" {
			count = 2
		}
		if r := wantRow(t, rows, key, "user", count, 401); r.ProjectID == nil || *r.ProjectID != w.Acme.DefaultProject {
			t.Fatalf("row %s: project %v, want acme's %s", key, r.ProjectID, w.Acme.DefaultProject)
		}
	}

	relayRows := w.deniedRows(t, "GET "+terminal.RouteRelay)
	if len(relayRows) != 2 {
		t.Fatalf("%d auth.denied rows on the relay route, want 2: %+v", len(relayRows), relayRows)
	}
	wantRow(t, relayRows, "ip token_missing", "service", 1, 401)
	wantRow(t, relayRows, "ip token_invalid", "service", 1, 401)
}
