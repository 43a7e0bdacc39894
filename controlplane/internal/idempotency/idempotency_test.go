package idempotency_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func createProject(e *apitest.Env, token, key, body string) *http.Response {
	req := e.Request("POST", "/api/v1/projects", token, body)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return e.Do(req)
}

func read(t *testing.T, resp *http.Response) (int, string) {
	t.Helper()
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}

func countProjects(t *testing.T, e *apitest.Env, name string) int {
	t.Helper()
	var n int
	if err := e.Pool.QueryRow(context.Background(), `SELECT count(*) FROM projects WHERE name = $1`, name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestReplayAndConflicts(t *testing.T) {
	e := apitest.New(t)
	_, adminTok := e.PlatformAdmin(t)
	ten := e.NewTenant(t, adminTok, "Idem")
	m := e.App.Metrics

	status, first := read(t, createProject(e, ten.AdminToken, "key-1", `{"name":"alpha"}`))
	if status != 201 {
		t.Fatalf("first: %d %s", status, first)
	}
	resp := createProject(e, ten.AdminToken, "key-1", `{"name":"alpha"}`)
	if resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("replay not marked")
	}
	status, second := read(t, resp)
	if status != 201 || second != first {
		t.Fatalf("replay: %d %s vs %s", status, second, first)
	}
	if n := countProjects(t, e, "alpha"); n != 1 {
		t.Fatalf("%d projects named alpha", n)
	}
	if got := testutil.ToFloat64(m.IdempotencyReplays); got != 1 {
		t.Fatalf("replays counter %v", got)
	}
	if got := testutil.ToFloat64(m.IdempotencyPersistedJSON); got != 1 {
		t.Fatalf("persisted counter %v", got)
	}

	// Same key, different body: 422, nothing runs.
	status, body := read(t, createProject(e, ten.AdminToken, "key-1", `{"name":"beta"}`))
	if status != 422 || !strings.Contains(body, `"validation_error"`) || !strings.Contains(body, "idempotency_key_reused") {
		t.Fatalf("different body: %d %s", status, body)
	}
	if n := countProjects(t, e, "beta"); n != 0 {
		t.Fatalf("beta created %d times", n)
	}

	// Keys are scoped by principal: another caller's identical key is independent.
	_, userTok := e.NewUser(t, ten.AdminToken, "member")
	if status, body := read(t, createProject(e, userTok, "key-1", `{"name":"gamma"}`)); status != 201 {
		t.Fatalf("other principal: %d %s", status, body)
	}

	// Key length: 128 is fine, 129 is a malformed request.
	if status, body := read(t, createProject(e, ten.AdminToken, strings.Repeat("k", 128), `{"name":"delta"}`)); status != 201 {
		t.Fatalf("128: %d %s", status, body)
	}
	status, body = read(t, createProject(e, ten.AdminToken, strings.Repeat("k", 129), `{"name":"epsilon"}`))
	if status != 400 || !strings.Contains(body, "key_too_long") || countProjects(t, e, "epsilon") != 0 {
		t.Fatalf("129: %d %s", status, body)
	}

	// A failed create keeps no key: the retry runs (and fails or succeeds on its own).
	status, _ = read(t, createProject(e, ten.AdminToken, "key-fail", `{"name":"x","slug":"default"}`))
	if status < 400 {
		t.Fatalf("duplicate slug accepted: %d", status)
	}
	var keys int
	if err := e.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'key-fail'`).Scan(&keys); err != nil || keys != 0 {
		t.Fatalf("failed request stored a key: %d %v", keys, err)
	}
	if status, body := read(t, createProject(e, ten.AdminToken, "key-fail", `{"name":"x","slug":"x-fixed"}`)); status != 201 {
		t.Fatalf("retry after failure: %d %s", status, body)
	}
}

func TestConcurrentDuplicatesCreateOneRow(t *testing.T) {
	e := apitest.New(t)
	_, adminTok := e.PlatformAdmin(t)
	ten := e.NewTenant(t, adminTok, "Concurrent")

	const n = 20
	statuses := make([]int, n)
	bodies := make([]string, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			req := e.Request("POST", "/api/v1/projects", ten.AdminToken, `{"name":"racer"}`)
			req.Header.Set("Idempotency-Key", "same-key")
			resp, err := e.HTTPClient().Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			statuses[i], bodies[i] = resp.StatusCode, string(b)
		}(i)
	}
	close(start)
	wg.Wait()

	if got := countProjects(t, e, "racer"); got != 1 {
		t.Fatalf("%d rows for 20 concurrent same-key creates", got)
	}
	created, conflicts := 0, 0
	var createdBody string
	for i, s := range statuses {
		switch s {
		case 201:
			created++
			if createdBody == "" {
				createdBody = bodies[i]
			} else if bodies[i] != createdBody {
				t.Fatalf("replayed body differs: %s vs %s", bodies[i], createdBody)
			}
		case 409:
			conflicts++
			var env struct {
				Code    string         `json:"code"`
				Details map[string]any `json:"details"`
			}
			_ = json.Unmarshal([]byte(bodies[i]), &env)
			if env.Code != "invalid_request" || env.Details["reason"] != "idempotency_key_in_progress" {
				t.Fatalf("409 body %s", bodies[i])
			}
		default:
			t.Fatalf("unexpected status %d: %s", s, bodies[i])
		}
	}
	if created == 0 || created+conflicts != n {
		t.Fatalf("created/replayed %d, in-progress %d", created, conflicts)
	}
	t.Logf("20 concurrent creates: %d answered 201 (1 original + replays), %d answered 409 in progress", created, conflicts)
}
