package server_test

import (
	"context"
	"crypto/sha256"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/shared/clock"
)

func login(t *testing.T, e *apitest.Env, username, password string) (status int, code, retryAfter string) {
	t.Helper()
	resp := e.Do(e.Request("POST", "/api/v1/auth/login", "", `{"username":"`+username+`","password":"`+password+`"}`))
	retryAfter = resp.Header.Get("Retry-After")
	if resp.StatusCode == 200 {
		resp.Body.Close()
		return 200, "", retryAfter
	}
	env := decodeEnvelope(t, resp)
	return resp.StatusCode, env.Code, retryAfter
}

func counterValue(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func throttleRow(t *testing.T, e *apitest.Env, username string) (failures int, found bool) {
	t.Helper()
	key := sha256.Sum256([]byte(username))
	err := e.Pool.QueryRow(context.Background(), `SELECT failures FROM auth_login_throttle WHERE username_hash = $1`, key[:]).Scan(&failures)
	if err != nil {
		return 0, false
	}
	return failures, true
}

// TestLoginBackoffPerAccount: repeated failed sign-ins of one username lock it with an
// exponential, capped backoff (429 rate_limit_exceeded with Retry-After, the password not
// even checked); a success clears it; an unknown username is treated exactly alike.
func TestLoginBackoffPerAccount(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC))
	e := apitest.New(t, apitest.WithOptions(func(o *app.Options) { o.Clock = clk }))
	_, adminTok := e.PlatformAdmin(t)
	user := e.NewTenant(t, adminTok, "Backoff").AdminUsername
	const wrong = "not the password 1"

	for _, name := range []string{user, "nobody-" + user} {
		for i := 1; i <= 5; i++ {
			if status, code, _ := login(t, e, name, wrong); status != 401 || code != "token_invalid" {
				t.Fatalf("%s failure %d: %d %s", name, i, status, code)
			}
		}
		// The 5th failure locked the name for 1 s: even the right password is refused.
		if status, code, retry := login(t, e, name, apitest.Password); status != 429 || code != "rate_limit_exceeded" || retry != "1" {
			t.Fatalf("%s locked: %d %s Retry-After %q", name, status, code, retry)
		}
		if n, _ := throttleRow(t, e, name); n != 5 {
			t.Fatalf("%s: %d failures recorded, want 5 (refusals are not failures)", name, n)
		}
		clk.Advance(time.Second)
		if status, _, _ := login(t, e, name, wrong); status != 401 {
			t.Fatalf("%s after the lock: %d", name, status)
		}
		if status, _, retry := login(t, e, name, wrong); status != 429 || retry != "2" {
			t.Fatalf("%s 6th failure doubles the lock: %d Retry-After %q", name, status, retry)
		}
	}
	// A success clears the record (the unknown name has none to clear).
	clk.Advance(2 * time.Second)
	if status, code, _ := login(t, e, user, apitest.Password); status != 200 {
		t.Fatalf("right password after the lock: %d %s", status, code)
	}
	if _, found := throttleRow(t, e, user); found {
		t.Fatal("throttle record kept after a successful sign-in")
	}
	if status, _, _ := login(t, e, user, wrong); status != 401 {
		t.Fatalf("first failure after success: %d", status)
	}

	// The lock is capped at 15 minutes however many failures came before.
	key := sha256.Sum256([]byte(user))
	if _, err := e.Pool.Exec(context.Background(), `UPDATE auth_login_throttle SET failures = 40 WHERE username_hash = $1`, key[:]); err != nil {
		t.Fatal(err)
	}
	login(t, e, user, wrong)
	if status, _, retry := login(t, e, user, wrong); status != 429 || retry != "900" {
		t.Fatalf("capped lock: %d Retry-After %q", status, retry)
	}
	clk.Advance(15 * time.Minute)
	if status, _, _ := login(t, e, user, apitest.Password); status != 200 {
		t.Fatalf("after the capped lock: %d", status)
	}
	if got := counterValue(t, e.App.Metrics.Registry, "api_login_backoff_refused_total"); got != 5 {
		t.Fatalf("api_login_backoff_refused_total = %v, want 5", got)
	}
	if got := counterValue(t, e.App.Metrics.Registry, "api_login_failures_total"); got != 14 {
		t.Fatalf("api_login_failures_total = %v, want 14", got)
	}
}

// TestLoginBackoffForgetsOldFailures: failures older than the memory start over.
func TestLoginBackoffForgetsOldFailures(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC))
	e := apitest.New(t, apitest.WithOptions(func(o *app.Options) { o.Clock = clk }))
	for range 4 {
		login(t, e, "someone-quiet", "not the password 1")
	}
	clk.Advance(time.Hour)
	for i := 1; i <= 4; i++ {
		if status, _, _ := login(t, e, "someone-quiet", "not the password 1"); status != 401 {
			t.Fatalf("failure %d after an hour: %d", i, status)
		}
	}
	if n, _ := throttleRow(t, e, "someone-quiet"); n != 4 {
		t.Fatalf("%d failures, want 4 (the old ones forgotten)", n)
	}
}

// TestLoginBackoffHoldsUnderConcurrentGuesses: of 20 simultaneous wrong sign-ins of one
// username exactly the 5 free ones reach the password check; the rest are refused,
// because each attempt is charged before its password is checked.
func TestLoginBackoffHoldsUnderConcurrentGuesses(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC))
	e := apitest.New(t, apitest.WithOptions(func(o *app.Options) { o.Clock = clk }))
	const n = 20
	statuses := make(chan int, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			req := e.Request("POST", "/api/v1/auth/login", "", `{"username":"burst-target","password":"not the password 1"}`)
			resp, err := e.HTTPClient().Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			statuses <- resp.StatusCode
		}()
	}
	close(start)
	wg.Wait()
	close(statuses)
	count := map[int]int{}
	for s := range statuses {
		count[s]++
	}
	if count[401] != 5 || count[429] != n-5 {
		t.Fatalf("answers %v, want 5×401 and %d×429", count, n-5)
	}
}
