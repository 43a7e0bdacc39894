package sshserver_test

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/nodeagent/sshserver"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

const allocID = "0193a000-0000-7000-8000-000000000001"

func newKey(t *testing.T) (ssh.Signer, string) {
	t.Helper()
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s, string(ssh.MarshalAuthorizedKey(s.PublicKey()))
}

// open serves one stream of pre on srv and returns the control plane's end after the
// agent's reply, or the refusal.
func open(t *testing.T, srv sshserver.Streams, pre *fabricv1.StreamPreamble) (net.Conn, error) {
	t.Helper()
	cp, agent := tcpPair(t)
	go func() {
		p, err := fabricnet.ReadPreamble(agent)
		if err != nil {
			_ = agent.Close()
			return
		}
		srv.ServeStream(context.Background(), p, agent)
	}()
	_ = cp.SetDeadline(time.Now().Add(30 * time.Second))
	if err := fabricnet.WriteFrame(cp, pre); err != nil {
		return nil, err
	}
	var rep fabricv1.StreamReply
	if err := fabricnet.ReadFrame(cp, &rep); err != nil {
		return nil, err
	}
	if !rep.GetOk() {
		_ = cp.Close()
		return nil, &fabricnet.StreamRefusedError{Code: rep.GetErrorCode(), Message: rep.GetMessage()}
	}
	_ = cp.SetDeadline(time.Time{})
	return cp, nil
}

// tcpPair is a connected loopback TCP pair (net.Pipe is unbuffered, and both SSH
// peers write their version line before reading).
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := <-acc
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	return a, b
}

func sshPre() *fabricv1.StreamPreamble {
	return &fabricv1.StreamPreamble{Kind: fabricv1.StreamKind_STREAM_KIND_SSH, StreamId: "s1", AllocationId: allocID}
}

func world(t *testing.T, env sshserver.Env, live bool, sshd string) sshserver.Streams {
	t.Helper()
	srv, err := sshserver.New(sshserver.EnvironmentsFunc(func(id string) (sshserver.Env, bool) {
		return env, live && id == allocID
	}), sshserver.Options{SSHDAddr: sshd})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return sshserver.Streams{SSH: srv}
}

// TestInProcessAuthExecAndRefusals: only the allocation's user with one of its keys gets
// in; a command's output and exit status come back; streams for an allocation that is
// not live here, and of other kinds with no other handler, are refused with their codes.
func TestInProcessAuthExecAndRefusals(t *testing.T) {
	home := t.TempDir()
	good, goodLine := newKey(t)
	bad, _ := newKey(t)
	keys := filepath.Join(t.TempDir(), "authorized_keys")
	if err := os.WriteFile(keys, []byte("# managed\n"+goodLine), 0o600); err != nil {
		t.Fatal(err)
	}
	env := sshserver.Env{AllocationID: allocID, User: "gantry-a1", Dir: home, Shell: "/bin/sh",
		Env: []string{"HOME=" + home, "GANTRY_ALLOCATION_ID=" + allocID}, AuthorizedKeys: keys}
	srv := world(t, env, true, "")

	dial := func(user string, key ssh.Signer) (*ssh.Client, error) {
		c, err := open(t, srv, sshPre())
		if err != nil {
			return nil, err
		}
		sc, chans, reqs, err := ssh.NewClientConn(c, "alloc", &ssh.ClientConfig{
			User: user, Auth: []ssh.AuthMethod{ssh.PublicKeys(key)}, HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: 30 * time.Second,
		})
		if err != nil {
			_ = c.Close()
			return nil, err
		}
		return ssh.NewClient(sc, chans, reqs), nil
	}
	for _, tc := range []struct {
		name string
		user string
		key  ssh.Signer
	}{{"wrong key", "gantry-a1", bad}, {"wrong user", "root", good}} {
		if _, err := dial(tc.user, tc.key); err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
			t.Fatalf("%s: %v, want an authentication failure", tc.name, err)
		}
	}
	c, err := dial("gantry-a1", good)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	out, err := sess.CombinedOutput(`echo "$PWD $GANTRY_ALLOCATION_ID"; exit 9`)
	var ee *ssh.ExitError
	if !errors.As(err, &ee) || ee.ExitStatus() != 9 || strings.TrimSpace(string(out)) != home+" "+allocID {
		t.Fatalf("exec: %v %q", err, out)
	}
	// A forward off the allocation's loopback is prohibited.
	if _, err := c.Dial("tcp", "192.0.2.1:80"); err == nil || !strings.Contains(err.Error(), "prohibited") {
		t.Fatalf("forward off loopback: %v", err)
	}

	var refused *fabricnet.StreamRefusedError
	if _, err := open(t, world(t, env, false, ""), sshPre()); !errors.As(err, &refused) || refused.Code != sshserver.CodeAllocationNotActive {
		t.Fatalf("not live: %v", err)
	}
	term := sshPre()
	term.Kind = fabricv1.StreamKind_STREAM_KIND_TERMINAL
	if _, err := open(t, srv, term); !errors.As(err, &refused) || refused.Code != sshserver.CodeUnsupportedKind {
		t.Fatalf("terminal without a handler: %v", err)
	}
}

// TestLinuxUserGoesToHostSSHD: a host-account allocation's stream is the host sshd's
// connection (here a listener that speaks first, as sshd does); an unreachable sshd is
// connect_failed.
func TestLinuxUserGoesToHostSSHD(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Write([]byte("SSH-2.0-OpenSSH_9.2\r\n"))
		line, _ := bufio.NewReader(c).ReadString('\n')
		_, _ = c.Write([]byte("got " + line))
	}()
	env := sshserver.Env{AllocationID: allocID, User: "gantry-a1", RealUser: true}
	sshd := ln.Addr().String()
	c, err := open(t, world(t, env, true, sshd), sshPre())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(c)
	banner, err := r.ReadString('\n')
	if err != nil || banner != "SSH-2.0-OpenSSH_9.2\r\n" {
		t.Fatalf("banner %q %v", banner, err)
	}
	_, _ = c.Write([]byte("SSH-2.0-client\n"))
	if got, err := r.ReadString('\n'); err != nil || got != "got SSH-2.0-client\n" {
		t.Fatalf("echo %q %v", got, err)
	}

	_ = ln.Close()
	var refused *fabricnet.StreamRefusedError
	if _, err := open(t, world(t, env, true, sshd), sshPre()); !errors.As(err, &refused) || refused.Code != sshserver.CodeConnectFailed {
		t.Fatalf("sshd down: %v", err)
	}
}
