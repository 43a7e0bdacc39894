// Package sshserver serves the SSH streams the control plane opens to this node
// (fabric StreamKind SSH, docs/ssh.md): one stream carries one SSH connection of a user
// running `gantry ssh-proxy`, so an allocation is reachable wherever its node is, NAT
// included.
//
// Where the allocation is a host account (the linux-user runtime) the stream is handed
// to the host's own sshd on loopback, which already trusts the account's
// ~/.ssh/authorized_keys: the agent only moves bytes. Where no sshd serves the
// allocation (the process runtime, `make dev`) the agent is the SSH server itself, with
// golang.org/x/crypto/ssh: public-key authentication against the allocation's
// authorized_keys only (read at every connection, so a key list rewritten by the runtime
// applies at once), sessions with a PTY and window changes, exec, environment, exit
// status, the SFTP subsystem (github.com/pkg/sftp) and direct-tcpip forwarding to the
// allocation's loopback only; everything runs as the allocation's user (which, in the
// process runtime, is the agent's own).
package sshserver

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// Refusal codes in the StreamReply.
const (
	CodeUnsupportedKind     = "unsupported_kind"
	CodeAllocationNotActive = "allocation_not_active"
	CodeConnectFailed       = "connect_failed"
	CodeBadPreamble         = "bad_preamble"
)

// DefaultSSHDAddr is the host's sshd for linux-user allocations.
const DefaultSSHDAddr = "127.0.0.1:22"

// Env is what the SSH server needs of a live allocation (nodeagent/runtime.SessionEnv,
// adapted by the agent).
type Env struct {
	AllocationID string
	// User is the allocation's user: the only login name accepted.
	User string
	// RealUser: a host account (linux-user runtime): the host's sshd serves it.
	RealUser bool
	// Dir is the allocation's home; Shell its login shell; Env its KEY=VALUE
	// environment (HOME, USER, GANTRY_ALLOCATION_ID, the GPU variables).
	Dir   string
	Shell string
	Env   []string
	// AuthorizedKeys is the allocation's authorized_keys file (in-process server only).
	AuthorizedKeys string
}

// Environments answers which allocations are live on this node.
type Environments interface {
	SSHEnv(allocationID string) (Env, bool)
}

// EnvironmentsFunc adapts a function.
type EnvironmentsFunc func(allocationID string) (Env, bool)

// SSHEnv calls f.
func (f EnvironmentsFunc) SSHEnv(id string) (Env, bool) { return f(id) }

// Options configure a Server.
type Options struct {
	// HostKey is the in-process server's host key (LoadOrCreateHostKey); nil generates
	// one per process (tests).
	HostKey ssh.Signer
	// SSHDAddr is the host's sshd for RealUser allocations (default DefaultSSHDAddr).
	SSHDAddr string
	Logger   *slog.Logger
}

// Server serves SSH streams (part of the agent's Options.Streams, see Streams).
type Server struct {
	envs Environments
	o    Options

	mu     sync.Mutex
	conns  map[*ssh.ServerConn]string // live in-process connections -> allocation id
	closed bool
}

// New returns a Server.
func New(envs Environments, o Options) (*Server, error) {
	if o.HostKey == nil {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, err
		}
		if o.HostKey, err = ssh.NewSignerFromKey(priv); err != nil {
			return nil, err
		}
	}
	if o.SSHDAddr == "" {
		o.SSHDAddr = DefaultSSHDAddr
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Server{envs: envs, o: o, conns: map[*ssh.ServerConn]string{}}, nil
}

// LoadOrCreateHostKey reads the OpenSSH ed25519 private key at path, creating it (0600)
// when absent, so the host key, and the users' known_hosts entries, survive restarts.
func LoadOrCreateHostKey(path string) (ssh.Signer, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		_, priv, gerr := ed25519.GenerateKey(rand.Reader)
		if gerr != nil {
			return nil, gerr
		}
		blk, merr := ssh.MarshalPrivateKey(priv, "gantry node agent ssh host key")
		if merr != nil {
			return nil, merr
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, err
		}
		b = pem.EncodeToMemory(blk)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	return ssh.ParsePrivateKey(b)
}

// ServeStream serves one SSH stream; it closes st.
func (s *Server) ServeStream(ctx context.Context, pre *fabricv1.StreamPreamble, st net.Conn) {
	if pre.GetKind() != fabricv1.StreamKind_STREAM_KIND_SSH {
		refuse(st, CodeUnsupportedKind, "not an SSH stream")
		return
	}
	env, ok := s.envs.SSHEnv(pre.GetAllocationId())
	if !ok {
		refuse(st, CodeAllocationNotActive, "the allocation is not running on this node")
		return
	}
	log := s.o.Logger.With("allocation_id", env.AllocationID, "stream_id", pre.GetStreamId(), "correlation_id", pre.GetCorrelationId())
	if env.RealUser {
		s.toSSHD(ctx, log, st)
		return
	}
	if err := fabricnet.WriteReply(st, &fabricv1.StreamReply{Ok: true}); err != nil {
		_ = st.Close()
		return
	}
	s.serveInProcess(ctx, log, env, st)
}

func refuse(st net.Conn, code, msg string) {
	_ = st.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_ = fabricnet.WriteReply(st, &fabricv1.StreamReply{Ok: false, ErrorCode: code, Message: msg})
	_ = st.Close()
}

// toSSHD connects the stream to the host's sshd.
func (s *Server) toSSHD(ctx context.Context, log *slog.Logger, st net.Conn) {
	d := net.Dialer{Timeout: 10 * time.Second}
	c, err := d.DialContext(ctx, "tcp", s.o.SSHDAddr)
	if err != nil {
		log.Warn("ssh: host sshd unreachable", "addr", s.o.SSHDAddr, "err", err)
		refuse(st, CodeConnectFailed, "the host's SSH server is not reachable")
		return
	}
	if err := fabricnet.WriteReply(st, &fabricv1.StreamReply{Ok: true}); err != nil {
		_ = c.Close()
		_ = st.Close()
		return
	}
	stop := context.AfterFunc(ctx, func() { _ = c.Close(); _ = st.Close() })
	defer stop()
	pipe(st, c)
}

// pipe copies both ways; when one side ends its writes, the other learns of it (half
// close where the connection has one), and both are closed when both directions end.
func pipe(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			_ = dst.Close()
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
	_ = a.Close()
	_ = b.Close()
}

// Close ends every in-process SSH connection.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	conns := make([]*ssh.ServerConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// EndAllocation ends the allocation's in-process SSH connections (it stopped or was
// released).
func (s *Server) EndAllocation(allocationID string) {
	s.mu.Lock()
	var conns []*ssh.ServerConn
	for c, id := range s.conns {
		if id == allocationID {
			conns = append(conns, c)
		}
	}
	s.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// Streams routes the agent's raw streams by kind: SSH here, everything else to Other
// (the terminal server).
type Streams struct {
	SSH   *Server
	Other interface {
		ServeStream(ctx context.Context, pre *fabricv1.StreamPreamble, st net.Conn)
	}
}

// ServeStream implements the agent's StreamHandler.
func (m Streams) ServeStream(ctx context.Context, pre *fabricv1.StreamPreamble, st net.Conn) {
	if pre.GetKind() == fabricv1.StreamKind_STREAM_KIND_SSH && m.SSH != nil {
		m.SSH.ServeStream(ctx, pre, st)
		return
	}
	if m.Other == nil {
		refuse(st, CodeUnsupportedKind, fmt.Sprintf("this agent does not serve %s streams", pre.GetKind()))
		return
	}
	m.Other.ServeStream(ctx, pre, st)
}
