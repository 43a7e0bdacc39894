package terminal

import (
	"context"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/lifecycle"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
)

// The session table, walked whole: every (status, event) pair is either the documented
// move or refused.
func TestSessionTransitions(t *testing.T) {
	want := map[Status]map[event]Status{
		"":             {evAttach: StatusAttached},
		StatusAttached: {evAttach: StatusAttached, evDetach: StatusDetached, evEnd: StatusEnded},
		StatusDetached: {evAttach: StatusAttached, evEnd: StatusEnded},
		StatusEnded:    {},
	}
	for from, moves := range want {
		for _, e := range []event{evAttach, evDetach, evEnd} {
			to, ok := apply(from, e)
			wantTo, wantOK := moves[e]
			if ok != wantOK || to != wantTo {
				t.Errorf("%q --%s--> %q (%v), want %q (%v)", from, e, to, ok, wantTo, wantOK)
			}
		}
	}
}

type replicaOnly string

func (r replicaOnly) OpenStream(context.Context, uuid.UUID, *fabricv1.StreamPreamble) (net.Conn, error) {
	return nil, nil
}
func (r replicaOnly) ReplicaID() string { return string(r) }

// A relay token is good once, for its replica and allocation, until it expires, and
// only with the deployment's key.
func TestRelayTokens(t *testing.T) {
	clk := clock.NewManual(time.Now())
	key := []byte(strings.Repeat("k", 32))
	ra := &Service{deps: Deps{RelayKey: key, Fabric: replicaOnly("ra"), Clock: clk}}
	rb := &Service{deps: Deps{RelayKey: key, Fabric: replicaOnly("rb"), Clock: clk}}
	other := &Service{deps: Deps{RelayKey: []byte(strings.Repeat("x", 32)), Fabric: replicaOnly("ra"), Clock: clk}}
	alloc := uuid.New()
	claims := func() relayClaims {
		return relayClaims{Replica: "ra", Node: uuid.NewString(), Allocated: alloc.String(),
			Expires: clk.Now().Add(relayTokenTTL).UnixMilli(), Nonce: uuid.NewString()}
	}
	tok := rb.signRelay(claims())
	if _, err := ra.verifyRelay(tok, alloc); err != nil {
		t.Fatalf("good token: %v", err)
	}
	if _, err := ra.verifyRelay(tok, alloc); apierr.CodeOf(err) != apierr.TokenInvalid {
		t.Fatalf("replay: %v", err)
	}
	cases := map[string]struct {
		svc   *Service
		tok   string
		alloc uuid.UUID
		code  apierr.Code
	}{
		"wrong replica":    {rb, ra.signRelay(claims()), alloc, apierr.TokenInvalid},
		"wrong allocation": {ra, ra.signRelay(claims()), uuid.New(), apierr.TokenInvalid},
		"foreign key":      {ra, other.signRelay(claims()), alloc, apierr.TokenInvalid},
		"tampered":         {ra, strings.Replace(ra.signRelay(claims()), "ey", "eX", 1), alloc, apierr.TokenInvalid},
		"malformed":        {ra, "nodot", alloc, apierr.TokenInvalid},
	}
	for name, tc := range cases {
		if _, err := tc.svc.verifyRelay(tc.tok, tc.alloc); apierr.CodeOf(err) != tc.code {
			t.Errorf("%s: %v, want %s", name, err, tc.code)
		}
	}
	late := ra.signRelay(claims())
	clk.Advance(relayTokenTTL)
	if _, err := ra.verifyRelay(late, alloc); apierr.CodeOf(err) != apierr.TokenExpired {
		t.Fatalf("expired: %v", err)
	}
}

func TestOriginAndSubprotocols(t *testing.T) {
	s := &Service{cfg: Config{AllowedOrigins: []string{"console.example.com", "*.tenants.example.com", "https://ops.example.org"}}}
	for origin, want := range map[string]bool{
		"":                                 true, // not a browser
		"http://gantry.local:8080":         true, // this host
		"https://console.example.com":      true,
		"https://a.tenants.example.com":    true,
		"https://ops.example.org":          true,
		"http://ops.example.org":           false, // the pattern names the scheme
		"https://evil.example.net":         false,
		"https://console.example.com.evil": false,
		"null":                             false,
	} {
		r := httptest.NewRequest("GET", "http://gantry.local:8080/ws/terminal/x", nil)
		if origin != "" {
			r.Header.Set("Origin", origin)
		}
		if got := s.originAllowed(r); got != want {
			t.Errorf("origin %q allowed = %v, want %v", origin, got, want)
		}
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Add("Sec-WebSocket-Protocol", "gantry.terminal.v1, gantry.token.abc")
	if tok, err := tokenFromSubprotocols(r, Subprotocol); err != nil || tok != "abc" {
		t.Fatalf("token %q %v", tok, err)
	}
	if tok, err := newToken(); err != nil || !wellFormed(tok) || len(tok) != 43 {
		t.Fatalf("newToken %q %v", tok, err)
	}
	if wellFormed("abc") || wellFormed(strings.Repeat("=", 43)) {
		t.Fatal("malformed tokens accepted")
	}
}

// Every allocation status, from the lifecycle's own table: entering one may end
// terminals exactly when the status is not running and can be reached after the
// allocation ran (a session needs a running allocation).
func TestWhichStatusEventsMayEndSessions(t *testing.T) {
	afterRun := map[lifecycle.Status]bool{}
	queue := []lifecycle.Status{lifecycle.Active, lifecycle.Idle}
	for len(queue) > 0 {
		from := queue[0]
		queue = queue[1:]
		for _, e := range lifecycle.Events {
			out, err := lifecycle.Apply(from, e)
			if err != nil || afterRun[out.To] {
				continue
			}
			afterRun[out.To] = true
			queue = append(queue, out.To)
		}
	}
	for _, st := range lifecycle.Statuses {
		want := afterRun[st] && st != lifecycle.Active && st != lifecycle.Idle
		if got := mayEndSessions(string(st)); got != want {
			t.Errorf("mayEndSessions(%s) = %v, want %v (reachable after running: %v)", st, got, want, afterRun[st])
		}
	}
	if !afterRun[lifecycle.Released] || afterRun[lifecycle.Requested] || afterRun[lifecycle.Provisioning] {
		t.Errorf("lifecycle walk went wrong: %v", afterRun)
	}
}

// The output window: 0 takes the default, any negative value is off, and a window the
// agent would refuse is a configuration error at start rather than a protocol error on
// every terminal.
func TestOutputWindowConfig(t *testing.T) {
	cases := []struct {
		in, want int
		ok       bool
	}{
		{0, DefaultOutputWindow, true},
		{-1, -1, true},
		{-5, -1, true},
		{32 << 10, 32 << 10, true},
		{16 << 20, 16 << 20, true},
		{32<<10 - 1, 0, false},
		{16<<20 + 1, 0, false},
	}
	for _, c := range cases {
		cfg := Config{ReplicaBucket: "b", OutputWindow: c.in}
		err := cfg.setDefaults()
		if (err == nil) != c.ok {
			t.Errorf("OutputWindow %d: error %v, want ok %v", c.in, err, c.ok)
			continue
		}
		if c.ok && cfg.OutputWindow != c.want {
			t.Errorf("OutputWindow %d became %d, want %d", c.in, cfg.OutputWindow, c.want)
		}
		if !c.ok && !strings.Contains(err.Error(), "GANTRY_TERMINAL_OUTPUT_WINDOW") {
			t.Errorf("OutputWindow %d: error %q does not name the variable", c.in, err)
		}
	}
}
