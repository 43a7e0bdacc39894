package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultURL is the conventional local server: 127.0.0.1:5432, user postgres,
// database postgres, trust authentication.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Options tunes Start. The zero value is fine.
type Options struct {
	// Port to listen on; 0 picks a free port.
	Port int
	// BinDir holds initdb and postgres; "" finds the newest
	// /usr/lib/postgresql/<ver>/bin (or initdb on PATH).
	BinDir string
	// Log receives the server's output; nil appends to <dir>/server.log.
	Log io.Writer
	// StartTimeout bounds how long Start waits for the server to accept
	// connections (default 60s; ctx may cut it shorter).
	StartTimeout time.Duration
}

// Cluster is a running throwaway PostgreSQL cluster.
type Cluster struct {
	dir  string
	port int
	cmd  *exec.Cmd
	done chan struct{} // closed when the server process has exited
	log  io.Closer

	stopOnce sync.Once
	stopErr  error

	freezeMu sync.Mutex
	frozen   []int // pids Freeze stopped
}

// Start creates the cluster in dir if it does not exist yet (an existing
// cluster is reused) and starts it. Stop it with Stop.
func Start(ctx context.Context, dir string, opts Options) (*Cluster, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	bin := opts.BinDir
	if bin == "" {
		if bin, err = BinDir(); err != nil {
			return nil, err
		}
	}
	cred, err := runAs()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	if cred != nil {
		if err := chownTree(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, fmt.Errorf("pgcluster: chown %s to postgres: %w", dir, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "initdb"),
			"-D", dir, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
		setup(cmd, cred)
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("pgcluster: initdb %s: %w\n%s", dir, err, out)
		}
	}

	var logw io.Writer = opts.Log
	var logc io.Closer
	tail := &tailBuffer{max: 8 << 10}
	if logw == nil {
		f, err := os.OpenFile(filepath.Join(dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
		logw, logc = f, f
	}
	logw = io.MultiWriter(logw, tail)

	timeout := opts.StartTimeout
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	// A free port may be taken between picking and binding it: retry a little.
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port := opts.Port
		if port == 0 {
			if port, err = freePort(); err != nil {
				return nil, err
			}
		}
		c, err := launch(ctx, bin, dir, port, cred, logw, tail)
		if err == nil {
			c.log = logc
			return c, nil
		}
		lastErr = err
		if opts.Port != 0 || ctx.Err() != nil {
			break
		}
	}
	if logc != nil {
		logc.Close()
	}
	return nil, lastErr
}

func launch(ctx context.Context, bin, dir string, port int, cred *syscall.Credential, logw io.Writer, tail *tailBuffer) (*Cluster, error) {
	cmd := exec.Command(filepath.Join(bin, "postgres"),
		"-D", dir,
		"-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=",
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
		"-c", "max_connections=200",
	)
	setup(cmd, cred)
	// If this process dies without calling Stop, take the server down too
	// (SIGQUIT is PostgreSQL's immediate shutdown).
	cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT
	// Its own process group: a Ctrl-C in the terminal reaches the program that started
	// the cluster, which stops it after draining, not PostgreSQL directly.
	cmd.SysProcAttr.Setpgid = true
	cmd.Stdout, cmd.Stderr = logw, logw
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pgcluster: start postgres: %w", err)
	}
	c := &Cluster{dir: dir, port: port, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(c.done) }()

	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := Ping(pctx, c.URL())
		cancel()
		if err == nil {
			return c, nil
		}
		select {
		case <-c.done:
			return nil, fmt.Errorf("pgcluster: postgres exited during start-up (port %d): %s\n%s", port, cmd.ProcessState, tail)
		case <-ctx.Done():
			c.Stop()
			return nil, fmt.Errorf("pgcluster: postgres not ready on port %d: %w (last: %v)\n%s", port, ctx.Err(), err, tail)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// URL is postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// Port the server listens on.
func (c *Cluster) Port() int { return c.port }

// Dir is the cluster's data directory.
func (c *Cluster) Dir() string { return c.dir }

// Stop shuts the server down (fast shutdown, then kill after 10s) and waits
// for it to exit. The data directory is kept. Safe to call more than once.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		c.Thaw() // a frozen server cannot shut down
		_ = c.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.done
			c.stopErr = errors.New("pgcluster: postgres did not stop in 10s; killed")
		}
		if c.log != nil {
			c.log.Close()
		}
	})
	return c.stopErr
}

// BinDir finds the directory holding initdb and postgres: the newest
// /usr/lib/postgresql/<ver>/bin, else the directory of initdb on PATH.
func BinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("pgcluster: no PostgreSQL server binaries (initdb, postgres) in /usr/lib/postgresql/*/bin or on PATH")
}

func version(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// Ping connects to url and pings the server.
func Ping(ctx context.Context, url string) error {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.Ping(ctx)
}

// Discover returns the first candidate URL whose server answers within two
// seconds. Empty candidates are skipped; with no non-empty candidate it tries
// DefaultURL. So Discover(ctx, os.Getenv("DATABASE_URL")) means "DATABASE_URL
// when set, else the local server".
func Discover(ctx context.Context, candidates ...string) (url string, ok bool) {
	var urls []string
	for _, c := range candidates {
		if c != "" {
			urls = append(urls, c)
		}
	}
	if len(urls) == 0 {
		urls = []string{DefaultURL}
	}
	for _, u := range urls {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := Ping(pctx, u)
		cancel()
		if err == nil {
			return u, true
		}
	}
	return "", false
}

// runAs returns the credential to run PostgreSQL under: the postgres OS user
// when we are root, nil (ourselves) otherwise.
func runAs() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: running as root and there is no postgres OS user to run PostgreSQL as: %w", err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

func setup(cmd *exec.Cmd, cred *syscall.Credential) {
	cmd.Env = []string{"LC_ALL=C.UTF-8", "LANG=C.UTF-8", "PATH=/usr/bin:/bin", "HOME=/tmp"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
}

func chownTree(dir string, uid, gid int) error {
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgcluster: pick a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// tailBuffer keeps the last max bytes written, for error messages.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if over := b.buf.Len() - b.max; over > 0 {
		b.buf.Next(over)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
