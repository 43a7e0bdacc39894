package sshserver_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/nodeagent/sshserver"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

// TestLinuxUserThroughRealSSHD: a linux-user allocation's stream reaches the host's
// OpenSSH server (Debian's /usr/sbin/sshd on a free loopback port with its own config
// and host key): the key sshd trusts gets in, a command's exit status comes back, and
// another key is refused by sshd itself.
func TestLinuxUserThroughRealSSHD(t *testing.T) {
	_, err := exec.LookPath("/usr/sbin/sshd")
	ci.SkipUnlessAvailable(t, "/usr/sbin/sshd", err)
	if os.Geteuid() != 0 {
		ci.Missing(t, "sshd with privilege separation needs root")
	}
	dir := t.TempDir()
	signer, line := newKey(t)
	other, _ := newKey(t)
	auth := filepath.Join(dir, "authorized_keys")
	if err := os.WriteFile(auth, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	hostKey := filepath.Join(dir, "host_key")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", hostKey).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v %s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	cfg := filepath.Join(dir, "sshd_config")
	conf := fmt.Sprintf("Port %d\nListenAddress 127.0.0.1\nHostKey %s\nAuthorizedKeysFile %s\nPidFile none\nStrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n", port, hostKey, auth)
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = os.MkdirAll("/run/sshd", 0o755)
	sshd := exec.Command("/usr/sbin/sshd", "-D", "-e", "-f", cfg)
	var logs strings.Builder
	sshd.Stderr = &logs
	if err := sshd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sshd.Process.Kill(); _ = sshd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sshd did not listen: %s", logs.String())
		}
	}
	srv := world(t, sshserver.Env{AllocationID: allocID, User: "root", RealUser: true}, true, addr)
	connect := func(key ssh.Signer) (*ssh.Client, error) {
		c, err := open(t, srv, sshPre())
		if err != nil {
			return nil, err
		}
		sc, chans, reqs, err := ssh.NewClientConn(c, "alloc", &ssh.ClientConfig{
			User: "root", Auth: []ssh.AuthMethod{ssh.PublicKeys(key)}, HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: 30 * time.Second,
		})
		if err != nil {
			_ = c.Close()
			return nil, err
		}
		return ssh.NewClient(sc, chans, reqs), nil
	}
	if _, err := connect(other); err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
		t.Fatalf("another key: %v", err)
	}
	client, err := connect(signer)
	if err != nil {
		t.Fatalf("%v\n%s", err, logs.String())
	}
	defer client.Close()
	sess, err := client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	out, err := sess.CombinedOutput("echo from-sshd; exit 6")
	var ee *ssh.ExitError
	if !errors.As(err, &ee) || ee.ExitStatus() != 6 || strings.TrimSpace(string(out)) != "from-sshd" {
		t.Fatalf("exec through sshd: %v %q", err, out)
	}
}
