package sshserver_test

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/nodeagent/sshserver"
)

// TestCipherFollowsClient: a client that offers AES-GCM gets it even when it prefers
// chacha20-poly1305 (OpenSSH's order; x/crypto's ChaCha20 has no amd64 assembly and
// was the largest cost of scp through the tunnel), and a client without AES-GCM still
// connects with its own choice (the server then offers its full default list). Each
// connection then runs a command, so the bytes replayed after the peek are the ones
// the handshake needed.
func TestCipherFollowsClient(t *testing.T) {
	home := t.TempDir()
	key, line := newKey(t)
	keys := filepath.Join(t.TempDir(), "authorized_keys")
	if err := os.WriteFile(keys, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	env := sshserver.Env{AllocationID: allocID, User: "gantry-a1", Dir: home, Shell: "/bin/sh",
		Env: []string{"HOME=" + home}, AuthorizedKeys: keys}
	srv := world(t, env, true, "")
	openssh := []string{ssh.CipherChaCha20Poly1305, ssh.CipherAES128CTR, ssh.CipherAES192CTR, ssh.CipherAES256CTR,
		ssh.CipherAES128GCM, ssh.CipherAES256GCM}
	for _, tc := range []struct {
		name    string
		offered []string
		want    string
	}{
		{"OpenSSH's order", openssh, ssh.CipherAES128GCM},
		{"AES-256-GCM only", []string{ssh.CipherAES256GCM}, ssh.CipherAES256GCM},
		{"no AES-GCM (CTR)", []string{ssh.CipherAES128CTR}, ssh.CipherAES128CTR},
		{"no AES-GCM (ChaCha20)", []string{ssh.CipherChaCha20Poly1305}, ssh.CipherChaCha20Poly1305},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := open(t, srv, sshPre())
			if err != nil {
				t.Fatal(err)
			}
			cfg := &ssh.ClientConfig{
				User: env.User, Auth: []ssh.AuthMethod{ssh.PublicKeys(key)}, HostKeyCallback: ssh.InsecureIgnoreHostKey(),
				Timeout: 30 * time.Second,
			}
			cfg.Ciphers = tc.offered
			sc, chans, reqs, err := ssh.NewClientConn(c, "alloc", cfg)
			if err != nil {
				t.Fatal(err)
			}
			client := ssh.NewClient(sc, chans, reqs)
			defer client.Close()
			algs := sc.(ssh.AlgorithmsConnMetadata).Algorithms()
			if algs.Read.Cipher != tc.want || algs.Write.Cipher != tc.want {
				t.Fatalf("negotiated %s / %s, want %s", algs.Read.Cipher, algs.Write.Cipher, tc.want)
			}
			if string(client.ServerVersion()) != "SSH-2.0-gantry-nodeagent" {
				t.Fatalf("server version %q", client.ServerVersion())
			}
			sess, err := client.NewSession()
			if err != nil {
				t.Fatal(err)
			}
			if out, err := sess.Output("echo ok"); err != nil || string(out) != "ok\n" {
				t.Fatalf("exec: %v %q", err, out)
			}
		})
	}
}

// TestMalformedFirstPacketEndsConnection: a client whose first packet is not a KEXINIT
// (here a length no packet may have) is disconnected, not left hanging in the peek.
func TestMalformedFirstPacketEndsConnection(t *testing.T) {
	env := sshserver.Env{AllocationID: allocID, User: "gantry-a1", Dir: t.TempDir(), Shell: "/bin/sh",
		AuthorizedKeys: filepath.Join(t.TempDir(), "none")}
	c, err := open(t, world(t, env, true, ""), sshPre())
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write([]byte("SSH-2.0-probe\r\n\xff\xff\xff\xff\x00")); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("the server did not end the connection: %v (read %q)", err, b)
	}
	if !strings.HasPrefix(string(b), "SSH-2.0-gantry-nodeagent\r\n") {
		t.Fatalf("read %q", b)
	}
}

// TestClientThatWaitsForServerKexInit: a client that sends its version line and then
// waits for the server's KEXINIT before sending its own gets it (after kexInitWait, with
// the default list) rather than waiting out the handshake timeout.
func TestClientThatWaitsForServerKexInit(t *testing.T) {
	env := sshserver.Env{AllocationID: allocID, User: "gantry-a1", Dir: t.TempDir(), Shell: "/bin/sh",
		AuthorizedKeys: filepath.Join(t.TempDir(), "none")}
	c, err := open(t, world(t, env, true, ""), sshPre())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Well inside the server's 30 s handshake timeout.
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Write([]byte("SSH-2.0-waiter\r\n")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil || line != "SSH-2.0-gantry-nodeagent\r\n" {
		t.Fatalf("version line %q: %v", line, err)
	}
	var hdr [6]byte // packet length, padding length, message number
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		t.Fatalf("no KEXINIT from the server: %v", err)
	}
	if hdr[5] != 20 {
		t.Fatalf("first packet is message %d, want KEXINIT (20)", hdr[5])
	}
}
