package logship_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/loggateway/gateway"
	"github.com/gantry-gpu/gantry/loggateway/lokitest"
	"github.com/gantry-gpu/gantry/nodeagent/logship"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/nodetoken"
)

// node is an enrolled node as the gateway's introspector knows it.
type node struct {
	id    uuid.UUID
	token string
}

func newNode(t *testing.T) node {
	t.Helper()
	id := uuid.Must(uuid.NewV7())
	tok, err := nodetoken.New(id, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return node{id: id, token: tok}
}

// newGateway is the real gateway in front of a fake Loki that decodes the real format;
// only token introspection is in-process (the real one is tested in controlplane/e2e).
func newGateway(t *testing.T, loki *lokitest.Receiver, n node, edit func(*gateway.Config)) *gateway.Gateway {
	t.Helper()
	cfg := gateway.DefaultConfig()
	cfg.LokiURL = loki.URL()
	if edit != nil {
		edit(&cfg)
	}
	gw, err := gateway.New(cfg, gateway.Options{Introspector: gateway.IntrospectorFunc(func(_ context.Context, tok string) (uuid.UUID, error) {
		if tok == n.token {
			return n.id, nil
		}
		return uuid.Nil, gateway.ErrUnauthenticated
	})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	return gw
}

// serving is a gateway answering on a real listener, so it can be stopped and started
// again on the same address.
type serving struct {
	addr   string
	cancel context.CancelFunc
	done   chan error
}

func serve(t *testing.T, gw *gateway.Gateway, addr string) *serving {
	t.Helper()
	var ln net.Listener
	var err error
	for i := 0; i < 100; i++ { // the old listener's port may take a moment to free
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &serving{addr: ln.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- gw.Serve(ctx, ln) }()
	t.Cleanup(s.stop)
	return s
}

func (s *serving) stop() {
	s.cancel()
	<-s.done
	s.done <- nil // a second stop returns at once
}

func startShipper(t *testing.T, cfg logship.Config) (*logship.Shipper, func()) {
	t.Helper()
	sh, err := logship.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = sh.Run(ctx)
	}()
	stop := func() {
		cancel()
		<-done
	}
	t.Cleanup(stop)
	return sh, sync.OnceFunc(stop)
}

func fastConfig(url string, n node) logship.Config {
	return logship.Config{
		GatewayURL:  url,
		Token:       func() string { return n.token },
		Labels:      map[string]string{"job": "gantry-nodeagent"},
		BatchWait:   20 * time.Millisecond,
		MinBackoff:  10 * time.Millisecond,
		MaxBackoff:  100 * time.Millisecond,
		PushTimeout: 2 * time.Second,
	}
}

func hasLines(want []string) func([]lokitest.Entry) bool {
	return func(got []lokitest.Entry) bool {
		seen := map[string]bool{}
		for _, e := range got {
			seen[e.Line] = true
		}
		for _, w := range want {
			if !seen[w] {
				return false
			}
		}
		return true
	}
}

func TestShipsAgentAndTaskLogsThroughGateway(t *testing.T) {
	loki := lokitest.New(t)
	n := newNode(t)
	gw := httptest.NewServer(newGateway(t, loki, n, nil).Handler())
	t.Cleanup(gw.Close)
	cfg := fastConfig(gw.URL, n)
	cfg.Labels["node_id"] = "claimed-by-the-agent" // the gateway's stamp wins
	sh, _ := startShipper(t, cfg)

	log := slog.New(sh.SlogHandler(nil))
	log.Info("agent started", "version", "1.2.3")
	w := sh.TaskWriter(logship.StreamProvision, "task-42")
	_, _ = w.Write([]byte("pulling image\nimage pul"))
	_, _ = w.Write([]byte("led\r\nno newline at end"))
	_ = w.Close()

	want := []string{"pulling image", "image pulled", "no newline at end"}
	if !loki.WaitFor(10*time.Second, func(es []lokitest.Entry) bool { return hasLines(want)(es) && len(es) == 4 }) {
		t.Fatalf("loki got %v", loki.Lines())
	}
	for _, e := range loki.Entries() {
		if e.Labels["node_id"] != n.id.String() || e.Labels["job"] != "gantry-nodeagent" {
			t.Errorf("%q: labels %v", e.Line, e.Labels)
		}
		switch {
		case strings.Contains(e.Line, `"msg":"agent started"`):
			if e.Labels["stream"] != logship.StreamAgent {
				t.Errorf("agent record labels %v", e.Labels)
			}
		case slices.Contains(want, e.Line):
			if e.Labels["stream"] != logship.StreamProvision || e.Metadata["task_id"] != "task-42" {
				t.Errorf("task line %q: labels %v metadata %v", e.Line, e.Labels, e.Metadata)
			}
		default:
			t.Errorf("unexpected line %q", e.Line)
		}
	}
}

func TestRetriesLoki429And5xxHonouringRetryAfter(t *testing.T) {
	loki := lokitest.New(t)
	n := newNode(t)
	gw := httptest.NewServer(newGateway(t, loki, n, nil).Handler())
	t.Cleanup(gw.Close)
	loki.Script(
		lokitest.Response{Status: http.StatusTooManyRequests, RetryAfter: "3"},
		lokitest.Response{Status: http.StatusInternalServerError},
		lokitest.Response{Status: http.StatusServiceUnavailable},
	)
	var mu sync.Mutex
	var waits []time.Duration
	cfg := fastConfig(gw.URL, n)
	cfg.MinBackoff, cfg.MaxBackoff = 0, 0 // the defaults: 500 ms up to 2 min
	cfg.Sleep = func(ctx context.Context, d time.Duration) error {
		mu.Lock()
		waits = append(waits, d)
		mu.Unlock()
		return ctx.Err()
	}
	sh, _ := startShipper(t, cfg)
	st := sh.Stream(map[string]string{"stream": logship.StreamRuntime})
	for i := range 3 {
		sh.Log(st, fmt.Sprintf("line %d", i))
	}
	if !loki.WaitFor(10*time.Second, hasLines([]string{"line 0", "line 1", "line 2"})) {
		t.Fatalf("loki got %v", loki.Lines())
	}
	if got := len(loki.Entries()); got != 3 {
		t.Errorf("loki got %d entries, want 3 (no duplicates)", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(waits) != 3 {
		t.Fatalf("waits %v, want 3", waits)
	}
	if waits[0] != 3*time.Second {
		t.Errorf("after 429 Retry-After: 3 waited %v", waits[0])
	}
	if waits[1] < 400*time.Millisecond || waits[1] > 600*time.Millisecond {
		t.Errorf("first backoff %v, want 500 ms ±20%%", waits[1])
	}
	if waits[2] < 800*time.Millisecond || waits[2] > 1200*time.Millisecond {
		t.Errorf("second backoff %v, want 1 s ±20%%", waits[2])
	}
	if !waitFor(5*time.Second, func() bool { s := sh.Stats(); return s.Retries == 3 && s.Sent == 3 && s.SentBatches == 1 }) {
		t.Errorf("stats %+v", sh.Stats())
	}
}

func TestGatewayRestartWhileLoggingLosesNothing(t *testing.T) {
	loki := lokitest.New(t)
	n := newNode(t)
	first := serve(t, newGateway(t, loki, n, nil), "127.0.0.1:0")
	addr := first.addr // the second gateway takes it over
	cfg := fastConfig("http://"+addr, n)
	cfg.SpoolDir = t.TempDir()
	sh, _ := startShipper(t, cfg)
	st := sh.Stream(map[string]string{"stream": logship.StreamRuntime})

	var want []string
	var logged atomic.Int64
	logUntil := func(n int) {
		for int(logged.Load()) < n {
			i := int(logged.Add(1)) - 1
			line := fmt.Sprintf("line %04d", i)
			want = append(want, line)
			if !sh.Log(st, line) {
				t.Fatalf("%s dropped", line)
			}
			time.Sleep(time.Millisecond)
		}
	}
	logUntil(200)
	if !loki.WaitFor(10*time.Second, func(es []lokitest.Entry) bool { return len(es) > 0 }) {
		t.Fatal("nothing delivered before the restart")
	}
	first.stop() // the gateway goes away; the agent keeps logging
	logUntil(400)
	second := serve(t, newGateway(t, loki, n, nil), addr)
	logUntil(600)
	if !loki.WaitFor(20*time.Second, hasLines(want)) {
		got := map[string]bool{}
		for _, l := range loki.Lines() {
			got[l] = true
		}
		var missing []string
		for _, w := range want {
			if !got[w] {
				missing = append(missing, w)
			}
		}
		t.Fatalf("%d of %d lines lost across the restart: %v", len(missing), len(want), missing[:min(10, len(missing))])
	}
	s := sh.Stats()
	if s.DroppedQueueFull+s.DroppedSpoolFull+s.DroppedTooOld+s.DroppedRejected != 0 {
		t.Errorf("drops: %+v", s)
	}
	if s.Retries == 0 {
		t.Errorf("the outage caused no retries: %+v", s)
	}
	second.stop()
}

func TestSpoolSurvivesAgentRestart(t *testing.T) {
	loki := lokitest.New(t)
	n := newNode(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens: the gateway is down

	dir := t.TempDir()
	cfg := fastConfig("http://"+addr, n)
	cfg.SpoolDir = dir
	cfg.PushTimeout = 200 * time.Millisecond
	sh, stop := startShipper(t, cfg)
	st := sh.Stream(map[string]string{"stream": logship.StreamRelease})
	var want []string
	for i := range 50 {
		want = append(want, fmt.Sprintf("release step %d", i))
		sh.Log(st, want[i])
	}
	stop() // the agent stops with the gateway still down
	files, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	if len(files) == 0 {
		t.Fatal("nothing spooled to disk")
	}

	serve(t, newGateway(t, loki, n, nil), addr)
	startShipper(t, cfg) // the agent starts again on the same spool
	if !loki.WaitFor(10*time.Second, hasLines(want)) {
		t.Fatalf("loki got %d of %d lines", len(loki.Lines()), len(want))
	}
	if !waitFor(5*time.Second, func() bool { f, _ := filepath.Glob(filepath.Join(dir, "*.seg")); return len(f) == 0 }) {
		t.Error("delivered segments left in the spool")
	}
}

func TestDropsEventsOlderThanTenMinutes(t *testing.T) {
	loki := lokitest.New(t)
	n := newNode(t)
	gw := newGateway(t, loki, n, nil)
	var down atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(w, "gateway down", http.StatusBadGateway)
			return
		}
		gw.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	clk := clock.NewManual(time.Date(2026, 11, 21, 6, 0, 0, 0, time.UTC))
	t0 := clk.Now()
	cfg := fastConfig(srv.URL, n)
	cfg.Clock = clk
	// Retry waits are held until the test lets them go, so the clock moves while the
	// sender is known to be waiting.
	waiting := make(chan struct{}, 1)
	proceed := make(chan struct{})
	cfg.Sleep = func(ctx context.Context, _ time.Duration) error {
		select {
		case waiting <- struct{}{}:
		default:
		}
		select {
		case <-proceed:
		case <-ctx.Done():
		}
		return ctx.Err()
	}
	sh, _ := startShipper(t, cfg)
	st := sh.Stream(map[string]string{"stream": logship.StreamRuntime})

	// One batch with two stale events and three fresh ones: the stale ones are dropped
	// before the push, the rest delivered.
	sh.LogAt(st, t0.Add(-11*time.Minute), "stale 1")
	sh.LogAt(st, t0.Add(-10*time.Minute-time.Nanosecond), "stale 2")
	sh.Log(st, "fresh 1")
	sh.Log(st, "fresh 2")
	sh.LogAt(st, t0.Add(-10*time.Minute), "exactly ten minutes old") // not older: kept
	if !loki.WaitFor(10*time.Second, hasLines([]string{"fresh 1", "fresh 2", "exactly ten minutes old"})) {
		t.Fatalf("loki got %v", loki.Lines())
	}
	if !waitFor(5*time.Second, func() bool { return sh.Stats().Sent == 3 }) || sh.Stats().DroppedTooOld != 2 {
		t.Fatalf("stats %+v: want 2 dropped too old, 3 sent", sh.Stats())
	}

	// During an outage a batch ages past ten minutes: dropped whole when the gateway is
	// back, while what was logged since is delivered.
	down.Store(true)
	for i := range 4 {
		sh.Log(st, fmt.Sprintf("aged %d", i))
	}
	select {
	case <-waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("no push attempted during the outage")
	}
	clk.Advance(10*time.Minute + time.Second)
	sh.Log(st, "after the outage")
	down.Store(false)
	close(proceed)
	if !loki.WaitFor(10*time.Second, hasLines([]string{"after the outage"})) {
		t.Fatalf("loki got %v", loki.Lines())
	}
	for _, l := range loki.Lines() {
		if strings.HasPrefix(l, "aged") || strings.HasPrefix(l, "stale") {
			t.Errorf("%q older than ten minutes was pushed", l)
		}
	}
	if !waitFor(5*time.Second, func() bool { s := sh.Stats(); return s.DroppedTooOld == 6 && s.Sent == 4 }) {
		t.Fatalf("stats %+v: want 6 dropped too old, 4 sent", sh.Stats())
	}
}

func TestQueueFullDropsAndNeverBlocks(t *testing.T) {
	n := newNode(t)
	cfg := fastConfig("http://127.0.0.1:1", n)
	cfg.QueueBytes = 4096
	sh, err := logship.New(cfg) // not running: nothing drains the queue
	if err != nil {
		t.Fatal(err)
	}
	st := sh.Stream(nil)
	accepted := 0
	for range 1000 {
		if sh.Log(st, strings.Repeat("x", 100)) {
			accepted++
		}
	}
	s := sh.Stats()
	if accepted == 0 || accepted >= 1000 || s.DroppedQueueFull != int64(1000-accepted) || s.Queued != int64(accepted) {
		t.Fatalf("accepted %d, stats %+v", accepted, s)
	}
}

func TestSpoolIsBounded(t *testing.T) {
	n := newNode(t)
	dir := t.TempDir()
	cfg := fastConfig("http://127.0.0.1:1", n) // nothing listens
	cfg.SpoolDir = dir
	cfg.SpoolMaxBytes = 8 << 10
	cfg.BatchBytes = 2 << 10
	sh, stop := startShipper(t, cfg)
	st := sh.Stream(nil)
	for i := range 400 {
		// Random-looking lines, so snappy cannot shrink the batches much.
		sh.Log(st, fmt.Sprintf("%d %s", i, uuid.NewString()))
		if i%50 == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if !waitFor(10*time.Second, func() bool { return sh.Stats().DroppedSpoolFull > 0 }) {
		t.Fatalf("the spool never evicted: %+v", sh.Stats())
	}
	stop()
	var total int64
	files, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	for _, f := range files {
		fi, err := os.Stat(f)
		if err == nil {
			total += fi.Size()
		}
	}
	if total > cfg.SpoolMaxBytes {
		t.Fatalf("spool holds %d bytes, bound %d", total, cfg.SpoolMaxBytes)
	}
}

func TestBatchRefusedForGoodIsDropped(t *testing.T) {
	loki := lokitest.New(t)
	n := newNode(t)
	gw := httptest.NewServer(newGateway(t, loki, n, func(c *gateway.Config) { c.MaxBytes = 4096; c.MemoryBudget = 1 << 20 }).Handler())
	t.Cleanup(gw.Close)
	sh, _ := startShipper(t, fastConfig(gw.URL, n))
	st := sh.Stream(nil)
	sh.Log(st, uuid.NewString()+strings.Repeat("y", 8192)) // over the gateway's cap: 413
	if !waitFor(10*time.Second, func() bool { return sh.Stats().DroppedRejected == 1 }) {
		t.Fatalf("stats %+v", sh.Stats())
	}
	sh.Log(st, "small")
	if !loki.WaitFor(10*time.Second, hasLines([]string{"small"})) {
		t.Fatal("the shipper stalled behind a refused batch")
	}
}

func TestFollowJournal(t *testing.T) {
	loki := lokitest.New(t)
	n := newNode(t)
	gw := httptest.NewServer(newGateway(t, loki, n, nil).Handler())
	t.Cleanup(gw.Close)
	// A stand-in journalctl that prints what `journalctl -f -o json` prints, then follows.
	dir := t.TempDir()
	script := filepath.Join(dir, "journalctl")
	us := time.Now().UnixMicro()
	body := `#!/bin/sh
echo "$@" > "` + filepath.Join(dir, "args") + `"
cat <<'EOF'
{"__CURSOR":"s=1","__REALTIME_TIMESTAMP":"` + fmt.Sprint(us) + `","PRIORITY":"6","MESSAGE":"Started nvidia-persistenced."}
{"__CURSOR":"s=2","__REALTIME_TIMESTAMP":"` + fmt.Sprint(us+1) + `","PRIORITY":"3","MESSAGE":[98,105,110,255]}
not json
EOF
exec sleep 600
`
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig(gw.URL, n)
	cfg.Journalctl = script
	sh, _ := startShipper(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sh.FollowJournal(ctx, "nvidia-persistenced.service") }()
	t.Cleanup(func() { cancel(); <-done })

	if !loki.WaitFor(10*time.Second, func(es []lokitest.Entry) bool { return len(es) == 2 }) {
		t.Fatalf("loki got %v", loki.Lines())
	}
	for _, e := range loki.Entries() {
		if e.Labels["unit"] != "nvidia-persistenced.service" || e.Labels["stream"] != logship.StreamJournal || e.Labels["node_id"] != n.id.String() {
			t.Errorf("labels %v", e.Labels)
		}
		if e.Line == "Started nvidia-persistenced." && (e.Metadata["priority"] != "6" || !e.TS.Equal(time.UnixMicro(us))) {
			t.Errorf("entry %+v", e)
		}
	}
	args, _ := os.ReadFile(filepath.Join(dir, "args"))
	if got := strings.TrimSpace(string(args)); got != "-f -o json -u nvidia-persistenced.service -n 0" {
		t.Errorf("journalctl args %q", got)
	}
	if err := sh.FollowJournal(ctx, "-evil"); err == nil {
		t.Error("a unit name starting with - was accepted")
	}
}

func waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return cond()
}
