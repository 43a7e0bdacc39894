package ratelimit_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/ratelimit"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

// ownRedis is a redis-server child of the test (never the machine's shared Redis), so
// the test may kill and freeze it.
type ownRedis struct {
	addr string
	cmd  *exec.Cmd
	done chan struct{}
}

func startOwnRedis(t *testing.T) *ownRedis {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	bin, err := exec.LookPath("redis-server")
	ci.SkipUnlessAvailable(t, "redis-server", err)
	dir := t.TempDir()
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--save", "", "--appendonly", "no", "--dir", dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	r := &ownRedis{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(r.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		r.Kill()
	})
	deadline := time.Now().Add(20 * time.Second)
	for !r.answers() {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server does not answer on %s", r.addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return r
}

func (r *ownRedis) answers() bool {
	c, err := net.DialTimeout("tcp", r.addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, "PING\r\n"); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "+PONG")
}

// Kill ends the server at once (SIGKILL) and waits for it.
func (r *ownRedis) Kill() {
	_ = r.cmd.Process.Kill()
	<-r.done
}

func (r *ownRedis) Signal(sig syscall.Signal) {
	if err := r.cmd.Process.Signal(sig); err != nil {
		panic(err)
	}
}

// outageEnv is a control plane limiting the api group to perMinute through the Redis at
// addr, on a manual clock one second into a minute, so every request falls in one window.
func outageEnv(t *testing.T, perMinute int, addr string) (*apitest.Env, *clock.Manual) {
	clk := clock.NewManual(time.Date(2026, 11, 25, 12, 0, 1, 0, time.UTC))
	e := apitest.New(t, limited(perMinute, "redis://"+addr), apitest.WithOptions(func(o *app.Options) { o.Clock = clk }))
	return e, clk
}

// health sends GET /api/v1/health and returns the status. It must answer within the
// client's timeout: a limiter waiting on a dead or frozen Redis must not hold requests.
func health(t *testing.T, e *apitest.Env) int {
	t.Helper()
	c := e.HTTPClient()
	c.Timeout = 10 * time.Second
	resp, err := c.Do(e.Request("GET", "/api/v1/health", "", ""))
	if err != nil {
		t.Fatalf("no answer while Redis is out: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
		t.Fatal("429 without Retry-After")
	}
	return resp.StatusCode
}

func statuses(t *testing.T, e *apitest.Env, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = health(t, e)
	}
	return out
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Redis killed: the replica keeps limiting in memory (the limit still holds), every
// request decided without Redis is counted in api_ratelimit_fail_open_total, and none
// waits on the dead server (issue 18 item 7).
func TestRedisKilledLimitsInMemory(t *testing.T) {
	r := startOwnRedis(t)
	e, _ := outageEnv(t, 3, r.addr)
	counter := e.App.Metrics.RateLimitFailOpen

	if got := statuses(t, e, 2); !equal(got, []int{200, 200}) || testutil.ToFloat64(counter) != 0 {
		t.Fatalf("with Redis: %v, fail-open %v", got, testutil.ToFloat64(counter))
	}
	r.Kill()
	// A fresh count in memory: three pass, then the limit holds.
	if got := statuses(t, e, 5); !equal(got, []int{200, 200, 200, 429, 429}) {
		t.Fatalf("with Redis killed: %v, want the limit of 3 held in memory", got)
	}
	if got := testutil.ToFloat64(counter); got != 5 {
		t.Fatalf("api_ratelimit_fail_open_total = %v, want 5", got)
	}
}

// Redis frozen (SIGSTOP: connections open, nothing answers): requests are answered, the
// limit holds in memory, and after SIGCONT the limiter goes back to Redis once
// StoreRetryInterval has passed (issue 18 item 7).
func TestRedisFrozenLimitsInMemoryAndRecovers(t *testing.T) {
	r := startOwnRedis(t)
	e, clk := outageEnv(t, 3, r.addr)
	counter := e.App.Metrics.RateLimitFailOpen

	if got := statuses(t, e, 2); !equal(got, []int{200, 200}) {
		t.Fatalf("with Redis: %v", got)
	}
	r.Signal(syscall.SIGSTOP)
	if got := statuses(t, e, 5); !equal(got, []int{200, 200, 200, 429, 429}) {
		t.Fatalf("with Redis frozen: %v, want the limit of 3 held in memory", got)
	}
	if got := testutil.ToFloat64(counter); got != 5 {
		t.Fatalf("api_ratelimit_fail_open_total = %v, want 5", got)
	}

	r.Signal(syscall.SIGCONT)
	waitRedis(t, r)
	// Until the retry interval has passed the limiter keeps to memory...
	if got := health(t, e); got != 429 || testutil.ToFloat64(counter) != 6 {
		t.Fatalf("before the retry interval: %d, fail-open %v", got, testutil.ToFloat64(counter))
	}
	// ... then counts in Redis again (which saw the two requests before the freeze, and
	// perhaps the one attempt cut off by the freeze: either way within the limit of 3
	// with this request, or just at it).
	clk.Advance(6 * time.Second)
	got := health(t, e)
	if testutil.ToFloat64(counter) != 6 {
		t.Fatalf("after the retry interval the request was still decided without Redis (fail-open %v)", testutil.ToFloat64(counter))
	}
	if got != 200 && got != 429 {
		t.Fatalf("after the retry interval: %d", got)
	}
}

func waitRedis(t *testing.T, r *ownRedis) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !r.answers() {
		if time.Now().After(deadline) {
			t.Fatal("Redis does not answer after SIGCONT")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The Redis client makes one attempt per call with short timeouts, and honours the
// limiter's context deadline on the socket. go-redis v9 reads MaxRetries 0 as three
// retries; -1 is none (issue 18 item 7).
func TestRedisOptionsAreBounded(t *testing.T) {
	o, err := ratelimit.RedisOptions("redis://127.0.0.1:6379/0")
	if err != nil {
		t.Fatal(err)
	}
	if o.MaxRetries != -1 {
		t.Errorf("MaxRetries %d, want -1 (no retries)", o.MaxRetries)
	}
	if !o.ContextTimeoutEnabled {
		t.Error("ContextTimeoutEnabled is off: the limiter's deadline would not reach the socket")
	}
	for name, d := range map[string]time.Duration{"dial": o.DialTimeout, "read": o.ReadTimeout, "write": o.WriteTimeout, "pool": o.PoolTimeout} {
		if d <= 0 || d > ratelimit.RedisTimeout {
			t.Errorf("%s timeout %s, want (0, %s]", name, d, ratelimit.RedisTimeout)
		}
	}
	// A frozen Redis (as SIGSTOP leaves one: the kernel completes the handshake, nothing
	// answers), where connections can be counted: a listener that accepts and never
	// answers. The context allows several read timeouts; one call must still make
	// exactly one attempt (with go-redis's default retries it makes four).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	store, err := ratelimit.NewRedis("redis://"+ln.Addr().String(), "")
	if err != nil {
		t.Fatal(err)
	}
	defer store.Client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := store.Hit(ctx, "k", time.Unix(0, 0)); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a server that never answers gave a count")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Hit did not return on a server that never answers")
	}
	if n := len(accepted); n != 1 {
		t.Fatalf("%d connections for one call, want 1 (no retries)", n)
	}
	for len(accepted) > 0 {
		(<-accepted).Close()
	}
}
