package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var redisAddr once[string]

// RedisAddr returns host:port of a Redis for tests: REDIS_URL's address when
// set (redis://[user:pass@]host:port[/db] or host:port); else 127.0.0.1:6379
// when it answers PING; else a redis-server child started once per test
// process (stopped by Main). It may be shared: prefix keys with Namespace.
// To stop Redis in a test, use StartRedis instead.
func RedisAddr(t testing.TB) string {
	t.Helper()
	a, err := redisAddr.get(findRedis)
	if err != nil {
		fail(t, err)
	}
	return a
}

func findRedis() (string, error) {
	if u := os.Getenv("REDIS_URL"); u != "" {
		addr := u
		if strings.Contains(u, "://") {
			pu, err := url.Parse(u)
			if err != nil {
				return "", misconfigured{fmt.Errorf("REDIS_URL: %v", err)}
			}
			addr = pu.Host
			if pu.Port() == "" {
				addr = net.JoinHostPort(pu.Hostname(), "6379")
			}
		}
		if !redisAnswers(addr) {
			return "", misconfigured{fmt.Errorf("REDIS_URL is set but nothing answers PING at %s", addr)}
		}
		return addr, nil
	}
	if redisAnswers(localRedis) {
		return localRedis, nil
	}
	r, err := startRedis()
	if err != nil {
		return "", fmt.Errorf("no Redis: REDIS_URL unset, nothing at %s, and %w", localRedis, err)
	}
	onExit(r.Stop)
	return r.Addr(), nil
}

// RedisProc is a private redis-server child process (no persistence).
type RedisProc struct {
	addr string
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
	once sync.Once
}

// StartRedis always starts a private redis-server on a free 127.0.0.1 port,
// stopped when the test ends, so a test may Stop it (to exercise fail-open
// paths, say) without touching any shared Redis. Skips, or fails under
// CI=true, when redis-server is not installed.
func StartRedis(t testing.TB) *RedisProc {
	t.Helper()
	r, err := startRedis()
	if err != nil {
		unavailable(t, "%v", err)
	}
	t.Cleanup(r.Stop)
	return r
}

// Addr is 127.0.0.1:PORT.
func (r *RedisProc) Addr() string { return r.addr }

// Stop terminates the server and waits for it to exit; afterwards connections
// to Addr are refused. Safe to call more than once.
func (r *RedisProc) Stop() {
	r.once.Do(func() {
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.done:
		case <-time.After(5 * time.Second):
			_ = r.cmd.Process.Kill()
			<-r.done
		}
		os.RemoveAll(r.dir)
	})
}

func startRedis() (*RedisProc, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("redis-server is not installed (apt-get install redis-server)")
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		r, err := launchRedis(bin)
		if err == nil {
			return r, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func launchRedis(bin string) (*RedisProc, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "gantry-testenv-redis-")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin,
		"--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--save", "", "--appendonly", "no", "--dir", dir)
	out := &syncWriter{w: &strings.Builder{}}
	cmd.Stdout, cmd.Stderr = out, out
	// Die with this process if it exits without Stop.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	r := &RedisProc{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(r.done) }()
	deadline := time.Now().Add(10 * time.Second)
	for !redisAnswers(r.addr) {
		select {
		case <-r.done:
			os.RemoveAll(dir)
			return nil, fmt.Errorf("redis-server exited during start-up on port %d: %s", port, out)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.Stop()
			return nil, fmt.Errorf("redis-server not answering on port %d after 10s", port)
		}
	}
	return r, nil
}

// redisAnswers reports whether a Redis at addr replies to PING (a "-NOAUTH"
// error counts: something is there).
func redisAnswers(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && (strings.HasPrefix(line, "+PONG") || strings.HasPrefix(line, "-NOAUTH"))
}

type syncWriter struct {
	mu sync.Mutex
	w  *strings.Builder
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}
