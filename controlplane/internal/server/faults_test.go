package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
)

// The request deadline of the fault tests, and how much longer than it a request may
// take before it counts as hung (the error write, a loaded 2-core machine).
const (
	faultRequestTimeout = time.Second
	faultHangBound      = faultRequestTimeout + 7*time.Second
	faultWait           = 90 * time.Second // any wait-for condition
)

// PostgreSQL stopped under load: requests answer 503 service_unavailable with
// Retry-After (never 500), none hangs, nothing half-written remains, and the control
// plane recovers when PostgreSQL is back, without a restart (issue 18 items 4, 5).
func TestPostgresStoppedUnderLoad(t *testing.T) {
	pg := startFaultyPostgres(t)
	l := newFaultLoad(t, pg)
	// A bearer whose key id the replica has not loaded makes the bearer check read the
	// keys from the database: while it is down that check decided nothing, so the
	// answer is 503, not 401 token_invalid.
	unknownKid := "eyJhbGciOiJSUzI1NiIsImtpZCI6IjAxOTAwMDAwLTAwMDAtNzAwMC04MDAwLTAwMDAwMDAwMDAwMSJ9.e30.c2ln"
	l.during = func() {
		if status, body := l.get("/api/v1/me", unknownKid); status != 503 || !strings.Contains(body, "service_unavailable") {
			t.Errorf("bearer check with the database down: %d %s", status, body)
		}
	}
	l.run(func() { pg.Stop() }, func() { pg.Start() })
	if status, body := l.get("/api/v1/me", unknownKid); status != 401 {
		t.Errorf("bearer with an unknown key id after healing: %d %s", status, body)
	}
}

// PostgreSQL frozen (SIGSTOP) under load: every request answers 503 within the request
// deadline for the whole outage, /readyz reports PostgreSQL down and NATS up, and
// everything recovers on SIGCONT (issue 18 items 5, 6).
func TestPostgresFrozenUnderLoad(t *testing.T) {
	pg := startFaultyPostgres(t)
	l := newFaultLoad(t, pg)
	l.during = func() {
		// Readiness while the database is frozen: each check has its own timeout, so
		// NATS is reported as it is.
		status, body := l.get("/readyz", "")
		if status != 503 || !strings.Contains(body, `"postgres":"down"`) || !strings.Contains(body, `"nats":"ok"`) {
			t.Errorf("readyz with PostgreSQL frozen: %d %s", status, body)
		}
	}
	l.run(pg.Freeze, pg.Thaw)
}

// faultLoad drives creates (with and without Idempotency-Key) and project-scoped reads
// against a control plane on a faulty PostgreSQL, and checks every answer.
type faultLoad struct {
	t      *testing.T
	e      *apitest.Env
	client *http.Client
	token  string
	proj   string
	// during runs once while the fault holds, after the load has seen it.
	during func()

	phase atomic.Int32 // 0 before the fault, 1 during, 2 after healing
	seq   atomic.Int64

	mu       sync.Mutex
	seen     map[[2]int]int    // {phase, status} -> count
	created  map[string]string // project name -> id, from 201 answers
	unsure   map[string]string // idempotency key -> project name, answered 503
	failures []string
}

func newFaultLoad(t *testing.T, pg *faultyPostgres) *faultLoad {
	pool := pg.Pool(faultRequestTimeout)
	e := apitest.New(t,
		apitest.WithOptions(func(o *app.Options) { o.Pool = pool }),
		apitest.WithConfig(func(c *app.Config) { c.RequestTimeout = faultRequestTimeout }))
	e.Pool = pool // the fixtures write to the app's database
	_, adminTok := e.PlatformAdmin(t)
	ten := e.NewTenant(t, adminTok, "Faults")
	client := e.HTTPClient() // validates every answer against the contract
	client.Timeout = faultHangBound
	return &faultLoad{
		t: t, e: e, client: client, token: ten.AdminToken, proj: ten.DefaultProject.String(),
		seen: map[[2]int]int{}, created: map[string]string{}, unsure: map[string]string{},
	}
}

func (l *faultLoad) fail(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.failures) < 20 {
		l.failures = append(l.failures, fmt.Sprintf(format, args...))
	}
}

func (l *faultLoad) count(phase, status int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seen[[2]int{phase, status}]
}

// do sends one request and checks the answer: 2xx, or 503 service_unavailable with
// Retry-After; anything else, or no answer within faultHangBound, is a failure.
func (l *faultLoad) do(method, path, body, key string) (int, []byte) {
	phase := int(l.phase.Load())
	req := l.e.Request(method, path, l.token, body)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := l.client.Do(req)
	if err != nil {
		l.fail("%s %s (phase %d): no answer: %v", method, path, phase, err)
		return 0, nil
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	l.mu.Lock()
	l.seen[[2]int{phase, resp.StatusCode}]++
	l.mu.Unlock()
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
	case resp.StatusCode == 503:
		var env struct {
			Code string `json:"code"`
		}
		_ = json.Unmarshal(b, &env)
		secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
		if env.Code != "service_unavailable" || err != nil || secs < 1 {
			l.fail("%s %s (phase %d): 503 code %q Retry-After %q", method, path, phase, env.Code, resp.Header.Get("Retry-After"))
		}
	default:
		l.fail("%s %s (phase %d): %d %s", method, path, phase, resp.StatusCode, b)
	}
	return resp.StatusCode, b
}

func (l *faultLoad) get(path, token string) (int, string) {
	req := l.e.Request("GET", path, token, "")
	resp, err := l.client.Do(req)
	if err != nil {
		l.t.Errorf("GET %s: no answer: %v", path, err)
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// create makes one project, with an Idempotency-Key every other time.
func (l *faultLoad) create() int {
	n := l.seq.Add(1)
	name := fmt.Sprintf("fault-%d", n)
	key := ""
	if n%2 == 0 {
		key = "fault-key-" + strconv.FormatInt(n, 10)
	}
	status, b := l.do("POST", "/api/v1/projects", fmt.Sprintf(`{"name":%q}`, name), key)
	switch {
	case status == 201:
		var p struct {
			Project struct {
				ID string `json:"id"`
			} `json:"project"`
		}
		if err := json.Unmarshal(b, &p); err != nil || p.Project.ID == "" {
			l.fail("create %s: 201 without id: %s", name, b)
			return status
		}
		l.mu.Lock()
		l.created[name] = p.Project.ID
		l.mu.Unlock()
	case key != "":
		// 503 or no answer: it may or may not have committed; retried after healing.
		l.mu.Lock()
		l.unsure[key] = name
		l.mu.Unlock()
	}
	return status
}

// run drives the load through a fault: it injects the fault once each kind of request
// has succeeded, holds it until each has answered 503 and for longer than a request may
// take (so a request that hung for the outage would be seen), heals it, and waits for a
// create to succeed again.
func (l *faultLoad) run(inject, heal func()) {
	t := l.t
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				status := 0
				if (w+i)%2 == 0 {
					status = l.create()
				} else {
					status, _ = l.do("GET", "/api/v1/projects/"+l.proj, "", "")
				}
				if status >= 500 || status == 0 {
					time.Sleep(20 * time.Millisecond) // a refused connection answers at once: spare the CPU
				}
			}
		}()
	}
	stopLoad := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}
	defer stopLoad()

	waitFor(t, "successes before the fault", func() bool { return l.count(0, 201) >= 2 && l.count(0, 200) >= 2 })
	faultAt := time.Now()
	l.phase.Store(1)
	inject()
	waitFor(t, "503 answers during the fault", func() bool { return l.count(1, 503) >= 6 })
	if l.during != nil {
		l.during()
	}
	for time.Since(faultAt) < faultHangBound+time.Second {
		time.Sleep(100 * time.Millisecond) // hold the outage past the hang bound
	}
	heal()
	l.phase.Store(2)
	waitFor(t, "a create after healing", func() bool { return l.count(2, 201) >= 1 && l.count(2, 200) >= 1 })
	stopLoad()

	l.mu.Lock()
	failures, seen := l.failures, l.seen
	l.mu.Unlock()
	t.Logf("answers by {phase, status}: %v", seen)
	for _, f := range failures {
		t.Error(f)
	}
	if seen[[2]int{1, 500}] > 0 || seen[[2]int{2, 500}] > 0 {
		t.Errorf("500 answers during or after the fault: %v", seen)
	}
	l.checkNothingHalfWritten()
}

// checkNothingHalfWritten: every project the load created has its audit row and its
// outbox event (one transaction), every 201 names a project that exists, and a key
// whose create answered 503 resolves to exactly one project when retried.
func (l *faultLoad) checkNothingHalfWritten() {
	t := l.t
	ctx := context.Background()
	for key, name := range l.unsure {
		// A 409 idempotency_key_in_progress is what a client must retry later: the first
		// attempt's backend, frozen with the server, holds the key's transaction lock
		// until it notices after the thaw that its client has gone.
		var status int
		var b []byte
		for deadline := time.Now().Add(faultHangBound); ; time.Sleep(50 * time.Millisecond) {
			status, b = l.do("POST", "/api/v1/projects", fmt.Sprintf(`{"name":%q}`, name), key)
			if status != http.StatusConflict || !bytes.Contains(b, []byte("idempotency_key_in_progress")) || time.Now().After(deadline) {
				break
			}
		}
		if status != 201 {
			t.Errorf("retry of %s after healing: %d %s", key, status, b)
		}
	}
	var orphans, missing, dup int
	err := l.e.Pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM projects p WHERE p.name LIKE 'fault-%' AND (
			NOT EXISTS (SELECT 1 FROM audit_events a WHERE a.action = 'project.create' AND a.target_id = p.id::text) OR
			NOT EXISTS (SELECT 1 FROM outbox_events o WHERE o.event_type = 'project.created' AND o.payload->>'project_id' = p.id::text))),
		(SELECT count(*) FROM audit_events a WHERE a.action = 'project.create' AND a.result = 'success'
			AND NOT EXISTS (SELECT 1 FROM projects p WHERE p.id::text = a.target_id)),
		(SELECT count(*) FROM (SELECT name FROM projects WHERE name LIKE 'fault-%' GROUP BY name HAVING count(*) > 1) d)`).
		Scan(&orphans, &missing, &dup)
	if err != nil {
		t.Fatalf("check the database: %v", err)
	}
	if orphans != 0 || missing != 0 || dup != 0 {
		t.Errorf("half-written: %d projects without audit row or event, %d audit rows without project, %d names created twice", orphans, missing, dup)
	}
	for name, id := range l.created {
		var n int
		if err := l.e.Pool.QueryRow(ctx, `SELECT count(*) FROM projects WHERE id = $1 AND name = $2`, id, name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("project %s (%s) answered 201 but is not in the database", name, id)
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(faultWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s", what, faultWait)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
