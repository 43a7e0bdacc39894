package sshserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"
)

// defaultPath is the PATH of a session whose environment sets none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// maxEnv bounds the variables a client may set in one session.
const maxEnv = 64

// authTimeout bounds the handshake and authentication.
const authTimeout = 30 * time.Second

// serveInProcess runs the SSH protocol over st for the allocation.
func (s *Server) serveInProcess(ctx context.Context, log *slog.Logger, env Env, st net.Conn) {
	defer st.Close()
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: func(md ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if md.User() != env.User {
				return nil, fmt.Errorf("user %q is not this allocation's", md.User())
			}
			if !authorized(env.AuthorizedKeys, key) {
				return nil, errors.New("key not authorized for this allocation")
			}
			return &ssh.Permissions{Extensions: map[string]string{"fp": ssh.FingerprintSHA256(key)}}, nil
		},
		MaxAuthTries:  6,
		ServerVersion: "SSH-2.0-gantry-nodeagent",
	}
	cfg.AddHostKey(s.o.HostKey)
	handshakeBy := time.Now().Add(authTimeout)
	_ = st.SetDeadline(handshakeBy)
	// AES-GCM for a client that speaks it (ciphers.go).
	pc, c2s, s2c, err := peekClientCiphers(st, cfg.ServerVersion)
	if err != nil {
		log.Info("ssh: handshake failed", "err", err)
		return
	}
	_ = st.SetDeadline(handshakeBy)
	cfg.Ciphers = serverCiphers(c2s, s2c)
	conn, chans, reqs, err := ssh.NewServerConn(pc, cfg)
	if err != nil {
		log.Info("ssh: handshake or authentication failed", "err", err)
		return
	}
	_ = st.SetDeadline(time.Time{})
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = conn.Close()
		return
	}
	s.conns[conn] = env.AllocationID
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, conn)
		s.mu.Unlock()
	}()
	log.Info("ssh: connection authenticated", "user", conn.User(), "key", conn.Permissions.Extensions["fp"])
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	go ssh.DiscardRequests(reqs)
	var wg sync.WaitGroup
	for nc := range chans {
		switch nc.ChannelType() {
		case "session":
			ch, creqs, err := nc.Accept()
			if err != nil {
				continue
			}
			wg.Add(1)
			go func() { defer wg.Done(); (&session{env: env, ch: ch, log: log}).serve(creqs) }()
		case "direct-tcpip":
			wg.Add(1)
			go func() { defer wg.Done(); forward(log, nc) }()
		default:
			_ = nc.Reject(ssh.UnknownChannelType, "unsupported channel type")
		}
	}
	_ = conn.Close()
	wg.Wait()
}

// authorized reports whether key is one of the lines of the authorized_keys file.
func authorized(path string, key ssh.PublicKey) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	want := key.Marshal()
	for len(b) > 0 {
		k, _, _, rest, err := ssh.ParseAuthorizedKey(b)
		if err != nil {
			return false
		}
		if bytes.Equal(k.Marshal(), want) {
			return true
		}
		b = rest
	}
	return false
}

// forward serves direct-tcpip (ssh -L): only to the allocation's loopback.
func forward(log *slog.Logger, nc ssh.NewChannel) {
	var p struct {
		Host       string
		Port       uint32
		OriginHost string
		OriginPort uint32
	}
	if err := ssh.Unmarshal(nc.ExtraData(), &p); err != nil {
		_ = nc.Reject(ssh.ConnectionFailed, "malformed request")
		return
	}
	if !loopback(p.Host) || p.Port == 0 || p.Port > 65535 {
		_ = nc.Reject(ssh.Prohibited, "forwarding is allowed to the allocation's loopback only")
		return
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort(p.Host, strconv.Itoa(int(p.Port))), 10*time.Second)
	if err != nil {
		_ = nc.Reject(ssh.ConnectionFailed, "connection refused")
		return
	}
	ch, reqs, err := nc.Accept()
	if err != nil {
		_ = c.Close()
		return
	}
	go ssh.DiscardRequests(reqs)
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(ch, c)
		_ = ch.CloseWrite()
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(c, ch)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	<-done
	<-done
	_ = ch.Close()
	_ = c.Close()
	log.Debug("ssh: forward ended", "port", p.Port)
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// session is one "session" channel.
type session struct {
	env Env
	ch  ssh.Channel
	log *slog.Logger

	mu      sync.Mutex
	vars    []string
	term    string
	ptmx    *os.File
	cols    uint16
	rows    uint16
	hasPTY  bool
	started bool
}

type ptyReq struct {
	Term     string
	Cols     uint32
	Rows     uint32
	WidthPx  uint32
	HeightPx uint32
	Modes    string
}

type winch struct {
	Cols     uint32
	Rows     uint32
	WidthPx  uint32
	HeightPx uint32
}

func (s *session) serve(reqs <-chan *ssh.Request) {
	defer s.ch.Close()
	for req := range reqs {
		ok := false
		switch req.Type {
		case "env":
			var kv struct{ Name, Value string }
			if ssh.Unmarshal(req.Payload, &kv) == nil && validEnvName(kv.Name) {
				s.mu.Lock()
				if len(s.vars) < maxEnv {
					s.vars = append(s.vars, kv.Name+"="+kv.Value)
					ok = true
				}
				s.mu.Unlock()
			}
		case "pty-req":
			var p ptyReq
			if ssh.Unmarshal(req.Payload, &p) == nil {
				s.mu.Lock()
				s.hasPTY, s.term, s.cols, s.rows = true, p.Term, clamp(p.Cols), clamp(p.Rows)
				s.mu.Unlock()
				ok = true
			}
		case "window-change":
			var w winch
			if ssh.Unmarshal(req.Payload, &w) == nil {
				s.resize(clamp(w.Cols), clamp(w.Rows))
				ok = true
			}
		case "shell", "exec", "subsystem":
			s.mu.Lock()
			already := s.started
			s.started = true
			s.mu.Unlock()
			if already {
				break
			}
			var start func() error
			switch req.Type {
			case "shell":
				start = func() error { return s.run("") }
			case "exec":
				var c struct{ Command string }
				if ssh.Unmarshal(req.Payload, &c) != nil {
					break
				}
				start = func() error { return s.run(c.Command) }
			case "subsystem":
				var c struct{ Name string }
				if ssh.Unmarshal(req.Payload, &c) != nil || c.Name != "sftp" {
					break
				}
				start = s.sftp
			}
			if start == nil {
				break
			}
			ok = true
			if req.WantReply {
				_ = req.Reply(true, nil)
			}
			go func() {
				if err := start(); err != nil {
					s.log.Info("ssh: session failed", "err", err)
					s.exit(255)
				}
			}()
			continue
		}
		if req.WantReply {
			_ = req.Reply(ok, nil)
		}
	}
}

func clamp(v uint32) uint16 {
	if v == 0 || v > 10000 {
		return 0
	}
	return uint16(v)
}

// validEnvName accepts conventional variable names; a client cannot smuggle "=" in.
func validEnvName(n string) bool {
	if n == "" || len(n) > 128 {
		return false
	}
	for i, r := range n {
		if !(r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

func (s *session) resize(cols, rows uint16) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cols != 0 {
		s.cols = cols
	}
	if rows != 0 {
		s.rows = rows
	}
	if s.ptmx != nil {
		_ = pty.Setsize(s.ptmx, &pty.Winsize{Cols: s.cols, Rows: s.rows})
	}
}

// environ is the process environment: the allocation's, PATH when it has none, the
// client's variables (which may not override the allocation's identity), and TERM.
func (s *session) environ() []string {
	out := append([]string(nil), s.env.Env...)
	has := map[string]bool{}
	for _, kv := range out {
		k, _, _ := strings.Cut(kv, "=")
		has[k] = true
	}
	if !has["PATH"] {
		out = append(out, "PATH="+defaultPath)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, kv := range s.vars {
		k, _, _ := strings.Cut(kv, "=")
		if has[k] || k == "TERM" {
			continue
		}
		out = append(out, kv)
	}
	if s.hasPTY && s.term != "" {
		out = append(out, "TERM="+s.term)
	}
	return out
}

func (s *session) shell() string {
	if s.env.Shell != "" {
		return s.env.Shell
	}
	return "/bin/sh"
}

// run starts the login shell (cmd "") or `shell -c cmd`, on a PTY when one was asked
// for, and reports its exit status.
func (s *session) run(cmd string) error {
	sh := s.shell()
	var c *exec.Cmd
	if cmd == "" {
		c = exec.Command(sh, "-l")
	} else {
		c = exec.Command(sh, "-c", cmd)
	}
	c.Env = s.environ()
	c.Dir = s.env.Dir
	s.mu.Lock()
	withPTY := s.hasPTY
	cols, rows := s.cols, s.rows
	s.mu.Unlock()
	if withPTY {
		if cols == 0 {
			cols = 80
		}
		if rows == 0 {
			rows = 24
		}
		ptmx, err := pty.StartWithSize(c, &pty.Winsize{Cols: cols, Rows: rows})
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.ptmx = ptmx
		s.mu.Unlock()
		go func() { _, _ = io.Copy(ptmx, s.ch) }()
		out := make(chan struct{})
		go func() { _, _ = io.Copy(s.ch, ptmx); close(out) }()
		err = c.Wait()
		// The output still in the PTY after the shell exits is read before the status.
		select {
		case <-out:
		case <-time.After(2 * time.Second):
		}
		_ = ptmx.Close()
		s.exit(status(c, err))
		return nil
	}
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	stdin, err := c.StdinPipe()
	if err != nil {
		return err
	}
	c.Stdout = s.ch
	c.Stderr = s.ch.Stderr()
	if err := c.Start(); err != nil {
		return err
	}
	go func() {
		_, _ = io.Copy(stdin, s.ch)
		_ = stdin.Close()
	}()
	err = c.Wait()
	s.exit(status(c, err))
	return nil
}

func status(c *exec.Cmd, err error) uint32 {
	if c.ProcessState != nil {
		if ws, ok := c.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + uint32(ws.Signal())
		}
		return uint32(c.ProcessState.ExitCode())
	}
	if err != nil {
		return 255
	}
	return 0
}

// exit sends the exit status and closes the channel.
func (s *session) exit(code uint32) {
	_, _ = s.ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{code}))
	_ = s.ch.CloseWrite()
	_ = s.ch.Close()
}

// sftp serves the SFTP subsystem rooted at the allocation's home (paths are the
// client's to choose, as with sshd's internal-sftp: the process runtime isolates
// nothing from the agent's user).
func (s *session) sftp() error {
	// The SFTP server closes what it serves when it ends; the channel must stay open
	// until the exit status is sent (scp reports a transfer without one as failed).
	rw := struct {
		io.Reader
		io.Writer
		io.Closer
	}{s.ch, s.ch, io.NopCloser(nil)}
	srv, err := sftp.NewServer(rw, sftp.WithServerWorkingDirectory(s.env.Dir))
	if err != nil {
		return err
	}
	err = srv.Serve()
	_ = srv.Close()
	if err != nil && !errors.Is(err, io.EOF) {
		s.exit(1)
		return nil
	}
	s.exit(0)
	return nil
}
