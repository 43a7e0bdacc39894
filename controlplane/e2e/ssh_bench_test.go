package e2e_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/shared/sshproxy"
)

// TestSSHBench is `make bench`'s SSH line (GANTRY_SSH_BENCH=1; other runs skip it, it
// moves GiBs): scp of GANTRY_SSH_BENCH_MIB (default 1024) MiB through the tunnel
// (ssh-proxy -> control plane -> fabric TCP -> agent's SSH server) against scp of the
// same file to a local OpenSSH sshd on loopback in the same run, and the p99 of a
// keystroke's echo on a PTY through the tunnel against the same client straight to
// that sshd. It reports figures; it asserts only that every transfer arrived whole.
func TestSSHBench(t *testing.T) {
	if os.Getenv("GANTRY_SSH_BENCH") != "1" {
		t.Skip("set GANTRY_SSH_BENCH=1 (make bench)")
	}
	mib := 1024
	if v := os.Getenv("GANTRY_SSH_BENCH_MIB"); v != "" {
		_, _ = fmt.Sscan(v, &mib)
	}
	w := newSSHWorld(t, "tcp")
	dir := t.TempDir()
	sshdPort := startSSHD(t, dir, w.keyFile)

	src := filepath.Join(dir, "bench.bin")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(f, rand.Reader, int64(mib)<<20); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	want := fileHash(t, src)

	limit := 20 * time.Minute
	start := time.Now()
	if out, code := w.command(t, limit, "scp", append(w.sshOpts(w.keyFile), src, w.host()+":bench.bin")...); code != 0 {
		t.Fatalf("scp through the tunnel: %d %s", code, out)
	}
	tunnel := time.Since(start)
	if fileHash(t, filepath.Join(w.home, "bench.bin")) != want {
		t.Fatal("the file through the tunnel differs")
	}
	_ = os.Remove(filepath.Join(w.home, "bench.bin"))

	direct := filepath.Join(dir, "direct.bin")
	start = time.Now()
	args := []string{"-F", "/dev/null", "-i", w.keyFile, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-P", fmt.Sprint(sshdPort),
		src, "root@127.0.0.1:" + direct}
	if out, err := exec.Command("scp", args...).CombinedOutput(); err != nil {
		t.Fatalf("scp to the local sshd: %v %s", err, out)
	}
	loop := time.Since(start)
	if fileHash(t, direct) != want {
		t.Fatal("the file to the local sshd differs")
	}
	rate := func(d time.Duration) float64 { return float64(mib) / d.Seconds() }
	fmt.Printf("ssh: scp %d MiB through the tunnel %.1f MiB/s, to local sshd on loopback %.1f MiB/s, ratio %.2fx (goal >= 0.5x)\n",
		mib, rate(tunnel), rate(loop), rate(tunnel)/rate(loop))

	// Keystroke echo on a PTY.
	signer := mustSigner(t, w.keyFile)
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	conn, err := sshproxy.Dial(ctx, sshproxy.Options{
		BaseURL: w.c.url, Bearer: func(context.Context) (string, error) { return w.token, nil },
		ProjectID: w.project, AllocationID: w.alloc.ID,
	})
	if err != nil {
		t.Fatal(err)
	}
	viaTunnel, tunnel50 := echoP99(t, conn, w.user, signer)
	dconn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", sshdPort))
	if err != nil {
		t.Fatal(err)
	}
	viaLoop, loop50 := echoP99(t, dconn, "root", signer)
	fmt.Printf("ssh: keystroke echo p99 through the tunnel %s, to local sshd %s, added %s (goal <= 2ms); p50 %s vs %s\n",
		viaTunnel.Round(time.Microsecond), viaLoop.Round(time.Microsecond), (viaTunnel - viaLoop).Round(time.Microsecond),
		tunnel50.Round(time.Microsecond), loop50.Round(time.Microsecond))
}

func mustSigner(t *testing.T, path string) ssh.Signer {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.ParsePrivateKey(b)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// echoP99 opens a shell on a PTY over conn, types 300 single characters one at a time
// and returns the 99th and 50th percentiles of the time until each one's echo arrives.
func echoP99(t *testing.T, conn net.Conn, user string, signer ssh.Signer) (p99, p50 time.Duration) {
	t.Helper()
	sc, chans, reqs, err := ssh.NewClientConn(conn, "bench", &ssh.ClientConfig{
		User: user, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: ssh.InsecureIgnoreHostKey(),
	})
	if err != nil {
		t.Fatal(err)
	}
	client := ssh.NewClient(sc, chans, reqs)
	defer client.Close()
	sess, err := client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if err := sess.RequestPty("xterm", 24, 80, ssh.TerminalModes{ssh.ECHO: 1}); err != nil {
		t.Fatal(err)
	}
	stdin, _ := sess.StdinPipe()
	stdout, _ := sess.StdoutPipe()
	if err := sess.Start("cat"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	// Warm up until the PTY echoes.
	_, _ = stdin.Write([]byte("w"))
	for seen := ""; !strings.Contains(seen, "w"); {
		n, err := stdout.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		seen += string(buf[:n])
	}
	var lat []time.Duration
	for i := 0; i < 300; i++ {
		start := time.Now()
		if _, err := stdin.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := stdout.Read(buf); err != nil {
			t.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	return lat[len(lat)*99/100], lat[len(lat)/2]
}

// startSSHD runs the Debian OpenSSH server on a free loopback port with its own host
// key and config, trusting key's public half for root, until the test ends.
func startSSHD(t *testing.T, dir, key string) int {
	t.Helper()
	if _, err := os.Stat("/usr/sbin/sshd"); err != nil {
		t.Fatalf("the bench needs /usr/sbin/sshd: %v", err)
	}
	_ = os.MkdirAll("/run/sshd", 0o755)
	hostKey := filepath.Join(dir, "ssh_host_ed25519_key")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", hostKey).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v %s", err, out)
	}
	pub, err := exec.Command("ssh-keygen", "-y", "-f", key).Output()
	if err != nil {
		t.Fatal(err)
	}
	auth := filepath.Join(dir, "authorized_keys")
	if err := os.WriteFile(auth, pub, 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	cfg := filepath.Join(dir, "sshd_config")
	conf := fmt.Sprintf("Port %d\nListenAddress 127.0.0.1\nHostKey %s\nAuthorizedKeysFile %s\nPidFile none\nStrictModes no\nUsePAM no\nPasswordAuthentication no\nPermitRootLogin prohibit-password\nSubsystem sftp internal-sftp\n", port, hostKey, auth)
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/usr/sbin/sshd", "-D", "-e", "-f", cfg)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	eventually(t, "sshd listening", func() bool {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	})
	return port
}
