package e2e_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/nodeagent/config"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/alloctask"
	"github.com/gantry-gpu/gantry/shared/sshproxy"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

// The test binary doubles as the OpenSSH ProxyCommand: ssh runs it with
// GANTRY_E2E_SSH_PROXY=1 in its environment, and it does what `gantry ssh-proxy` does
// (shared/sshproxy.Run) with the options from the environment.
func init() {
	if os.Getenv("GANTRY_E2E_SSH_PROXY") != "1" {
		return
	}
	err := sshproxy.Run(context.Background(), sshproxy.Options{
		BaseURL:      os.Getenv("GANTRY_E2E_URL"),
		Bearer:       func(context.Context) (string, error) { return os.Getenv("GANTRY_E2E_TOKEN"), nil },
		ProjectID:    uuid.MustParse(os.Getenv("GANTRY_E2E_PROJECT")),
		AllocationID: uuid.MustParse(os.Getenv("GANTRY_E2E_ALLOCATION")),
	}, os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ssh-proxy:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// sshWorld is an active allocation on a real gantry-nodeagent (process runtime, so the
// agent's own SSH server) and what the OpenSSH client needs to reach it.
type sshWorld struct {
	c        *cp
	alloc    api.Allocation
	project  uuid.UUID
	token    string // the tenant admin's access token
	user     string
	keyFile  string
	home     string
	proxyEnv []string
	// agentPID is the gantry-nodeagent process (the SSH bench reads its CPU time).
	agentPID int
}

func newSSHWorld(t *testing.T, transport string) *sshWorld {
	t.Helper()
	for _, tool := range []string{"ssh", "scp", "sftp"} {
		_, err := exec.LookPath(tool)
		ci.SkipUnlessAvailable(t, tool, err)
	}
	c := startCP(t)
	c.runBackground(c.app)
	c.catalogForAllocations()
	ctx := context.Background()
	name := "gpu-ssh-" + transport
	nodeID, tok := c.newNode(name)
	region := e2eRegion
	if r, err := c.client().UpdateNodeWithResponse(ctx, nodeID, &api.UpdateNodeParams{}, api.UpdateNodeJSONRequestBody{Region: &region}); err != nil || r.StatusCode() != 200 {
		t.Fatalf("node region: %v %s", err, r.Body)
	}
	e := c.enrollAgent(tok, name)
	e.cfg.Runtime = "process"
	e.cfg.Transport = transport
	e.cfg.StateDir = filepath.Join(filepath.Dir(e.cfg.Path), "state")
	e.cfg.AdvertiseHost = name + ".example"
	if err := config.Save(e.cfg.Path, e.cfg); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	run := exec.Command(buildAgent(t), "run", "--config", e.cfg.Path)
	run.Stdout, run.Stderr = &logs, &logs
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = run.Process.Signal(syscall.SIGTERM)
		_ = run.Wait()
		if t.Failed() {
			t.Logf("agent log:\n%s", logs.String())
		}
	})
	eventually(t, "agent online", func() bool {
		n, ok := c.fleetNode(nodeID)
		return ok && n.Status == api.NodeStatusOnline
	})

	tenant := c.env.NewTenant(t, c.admin, "SSH "+transport)
	alice := c.env.Client(tenant.AdminToken)
	dir := t.TempDir()
	keyFile, keyLine := writeKey(t, dir, "id_alice")
	if r, err := alice.CreateSSHKeyWithResponse(ctx, &api.CreateSSHKeyParams{}, api.CreateSSHKeyJSONRequestBody{Name: "laptop", PublicKey: keyLine}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("ssh key: %v %s", err, r.Body)
	}
	if r, err := c.client().CreateBillingAdjustmentWithResponse(ctx, &api.CreateBillingAdjustmentParams{},
		api.BillingAdjustmentRequest{TenantID: tenant.ID, Amount: api.Money{AmountMinor: 1_000_000, Currency: "USD"}, Reason: "e2e credit"}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("credit: %v %s", err, r.Body)
	}
	cr, err := alice.CreateAllocationWithResponse(ctx, &api.CreateAllocationParams{XProjectID: tenant.DefaultProject},
		api.CreateAllocationJSONRequestBody{Name: "ssh", Sku: e2eSKU})
	if err != nil || cr.StatusCode() != 201 {
		t.Fatalf("create: %v %s", err, cr.Body)
	}
	id := cr.JSON201.ID
	var a api.Allocation
	eventually(t, "allocation active", func() bool {
		r, err := alice.GetAllocationWithResponse(ctx, id, &api.GetAllocationParams{XProjectID: tenant.DefaultProject})
		if err != nil || r.JSON200 == nil {
			t.Fatalf("get: %v %s", err, r.Body)
		}
		a = *r.JSON200
		return a.Status == "active"
	})
	w := &sshWorld{
		c: c, alloc: a, project: tenant.DefaultProject, token: tenant.AdminToken, user: alloctask.UserName(id.String()),
		keyFile: keyFile, home: filepath.Join(e.cfg.StateDir, "allocations", id.String(), "home"),
		agentPID: run.Process.Pid,
	}
	w.proxyEnv = append(os.Environ(), "GANTRY_E2E_SSH_PROXY=1", "GANTRY_E2E_URL="+c.url, "GANTRY_E2E_TOKEN="+w.token,
		"GANTRY_E2E_PROJECT="+w.project.String(), "GANTRY_E2E_ALLOCATION="+id.String())
	return w
}

// writeKey writes a fresh ed25519 key pair in OpenSSH format (0600) and returns the
// private key's path and the public key's authorized_keys line.
func writeKey(t *testing.T, dir, name string) (string, string) {
	t.Helper()
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	blk, err := ssh.MarshalPrivateKey(priv, name)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(blk), 0o600); err != nil {
		t.Fatal(err)
	}
	sp, _ := ssh.NewPublicKey(pub)
	return path, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp)))
}

// sshOpts are the OpenSSH options of every client run: no user config, no host key
// bookkeeping, never a password prompt, this test binary as the ProxyCommand.
func (w *sshWorld) sshOpts(key string) []string {
	self, err := os.Executable()
	if err != nil {
		panic(err)
	}
	return []string{"-F", "/dev/null", "-i", key, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
		"-o", "ConnectTimeout=30", "-o", "ProxyCommand=" + self}
}

func (w *sshWorld) host() string { return w.user + "@alloc-" + w.alloc.ID.String() }

// command runs an OpenSSH tool (ssh, scp, sftp) with the proxy environment, bounded so a
// hang fails the test rather than blocking it.
func (w *sshWorld) command(t *testing.T, limit time.Duration, tool string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, tool, args...)
	cmd.Env = w.proxyEnv
	// The ProxyCommand inherits the output pipe; a proxy that outlived its ssh must not
	// hang the test (sshproxy.Run ends on its own; this bounds a regression).
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%s %v did not finish in %s: %s", tool, args, limit, out)
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return string(out), code
}

func fileHash(t *testing.T, path string) [32]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

// TestSSHThroughTunnel drives the real OpenSSH client through the ssh-proxy core, the
// control plane's /ws/ssh and the node's tunnel into the agent's SSH server, on both
// fabric transports: a command's output and exit status, 100 MiB both ways with scp
// (SFTP protocol up, legacy scp protocol down) compared by hash, an SFTP batch, a local
// port forward to a server on the allocation's loopback, a PTY with window changes and
// environment, and a key that is not the allocation's refused without a hang.
func TestSSHThroughTunnel(t *testing.T) {
	for _, transport := range []string{"tcp", "quic"} {
		t.Run(transport, func(t *testing.T) {
			w := newSSHWorld(t, transport)
			long := 3 * time.Minute

			t.Run("connection field", func(t *testing.T) {
				cn := w.alloc.Connection
				if cn == nil || cn.ProxyCommand == nil || cn.SSHCommand == nil {
					t.Fatalf("connection %+v lacks proxy_command/ssh_command", cn)
				}
				want := fmt.Sprintf("gantry ssh-proxy --project %s %s", w.project, w.alloc.ID)
				if *cn.ProxyCommand != want || !strings.Contains(*cn.SSHCommand, want) || !strings.Contains(*cn.SSHCommand, cn.User+"@") {
					t.Fatalf("proxy_command %q ssh_command %q, want %q", *cn.ProxyCommand, *cn.SSHCommand, want)
				}
			})

			t.Run("exec and exit status", func(t *testing.T) {
				out, code := w.command(t, long, "ssh", append(w.sshOpts(w.keyFile), w.host(), `echo "hello from $USER in $PWD"; echo err >&2; exit 7`)...)
				if code != 7 || !strings.Contains(out, "hello from "+w.user+" in "+w.home) || !strings.Contains(out, "err") {
					t.Fatalf("exit %d, output %q", code, out)
				}
			})

			t.Run("scp 100 MiB both ways", func(t *testing.T) {
				dir := t.TempDir()
				src := filepath.Join(dir, "up.bin")
				f, err := os.Create(src)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := io.CopyN(f, rand.Reader, 100<<20); err != nil {
					t.Fatal(err)
				}
				_ = f.Close()
				want := fileHash(t, src)
				if out, code := w.command(t, long, "scp", append(w.sshOpts(w.keyFile), src, w.host()+":up.bin")...); code != 0 {
					t.Fatalf("scp up: %d %s", code, out)
				}
				if got := fileHash(t, filepath.Join(w.home, "up.bin")); got != want {
					t.Fatal("the uploaded file differs")
				}
				back := filepath.Join(dir, "down.bin")
				if out, code := w.command(t, long, "scp", append(append(w.sshOpts(w.keyFile), "-O"), w.host()+":up.bin", back)...); code != 0 {
					t.Fatalf("scp down: %d %s", code, out)
				}
				if got := fileHash(t, back); got != want {
					t.Fatal("the downloaded file differs")
				}
			})

			t.Run("sftp", func(t *testing.T) {
				dir := t.TempDir()
				local := filepath.Join(dir, "notes.txt")
				if err := os.WriteFile(local, []byte("sftp through the tunnel\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				batch := filepath.Join(dir, "batch")
				script := fmt.Sprintf("mkdir data\nput %s data/notes.txt\nls data\nrename data/notes.txt data/renamed.txt\nget data/renamed.txt %s\n", local, filepath.Join(dir, "got.txt"))
				if err := os.WriteFile(batch, []byte(script), 0o600); err != nil {
					t.Fatal(err)
				}
				out, code := w.command(t, long, "sftp", append(append(w.sshOpts(w.keyFile), "-b", batch), w.host())...)
				if code != 0 || !strings.Contains(out, "notes.txt") {
					t.Fatalf("sftp: %d %s", code, out)
				}
				got, err := os.ReadFile(filepath.Join(dir, "got.txt"))
				if err != nil || string(got) != "sftp through the tunnel\n" {
					t.Fatalf("sftp get: %v %q", err, got)
				}
				if _, err := os.Stat(filepath.Join(w.home, "data", "renamed.txt")); err != nil {
					t.Fatalf("not in the allocation's home: %v", err)
				}
			})

			t.Run("local port forward", func(t *testing.T) {
				// A server inside the allocation, on its loopback.
				srv, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				defer srv.Close()
				go func() {
					for {
						c, err := srv.Accept()
						if err != nil {
							return
						}
						go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
					}
				}()
				lp := freePort(t)
				ctx, cancel := context.WithTimeout(context.Background(), long)
				defer cancel()
				args := append(w.sshOpts(w.keyFile), "-N", "-o", "ExitOnForwardFailure=yes",
					"-L", fmt.Sprintf("127.0.0.1:%d:%s", lp, srv.Addr().String()), w.host())
				fwd := exec.CommandContext(ctx, "ssh", args...)
				fwd.Env = w.proxyEnv
				fwd.WaitDelay = 10 * time.Second
				var fout bytes.Buffer
				fwd.Stdout, fwd.Stderr = &fout, &fout
				if err := fwd.Start(); err != nil {
					t.Fatal(err)
				}
				defer func() { _ = fwd.Process.Kill(); _ = fwd.Wait() }()
				var c net.Conn
				eventually(t, "the forwarded port open", func() bool {
					c, err = net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", lp))
					return err == nil
				})
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(time.Minute))
				msg := []byte("through the forward")
				if _, err := c.Write(msg); err != nil {
					t.Fatal(err)
				}
				got := make([]byte, len(msg))
				if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
					t.Fatalf("echo %q %v (ssh: %s)", got, err, fout.String())
				}
				// Forwarding anywhere but the allocation's loopback is refused.
				out, _ := w.command(t, long, "ssh", append(w.sshOpts(w.keyFile), "-W", "192.0.2.1:80", w.host())...)
				if !strings.Contains(out, "prohibited") && !strings.Contains(out, "forward") {
					t.Fatalf("a forward off loopback: %s", out)
				}
			})

			t.Run("pty, window change, env through sshproxy.Dial", func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), long)
				defer cancel()
				conn, err := sshproxy.Dial(ctx, sshproxy.Options{
					BaseURL: w.c.url, Bearer: func(context.Context) (string, error) { return w.token, nil },
					ProjectID: w.project, AllocationID: w.alloc.ID,
				})
				if err != nil {
					t.Fatal(err)
				}
				key, _ := os.ReadFile(w.keyFile)
				signer, err := ssh.ParsePrivateKey(key)
				if err != nil {
					t.Fatal(err)
				}
				sc, chans, reqs, err := ssh.NewClientConn(conn, "alloc", &ssh.ClientConfig{
					User: w.user, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: ssh.InsecureIgnoreHostKey(),
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
				if err := sess.Setenv("GANTRY_TEST_VAR", "from-the-client"); err != nil {
					t.Fatal(err)
				}
				if err := sess.RequestPty("xterm", 30, 100, ssh.TerminalModes{}); err != nil {
					t.Fatal(err)
				}
				stdin, _ := sess.StdinPipe()
				var out syncBuffer
				sess.Stdout = &out
				if err := sess.Shell(); err != nil {
					t.Fatal(err)
				}
				_, _ = io.WriteString(stdin, "stty size; echo \"v=$GANTRY_TEST_VAR t=$TERM\"; tty\n")
				eventually(t, "30 100 and the env", func() bool {
					s := out.String()
					return strings.Contains(s, "30 100") && strings.Contains(s, "v=from-the-client t=xterm") && strings.Contains(s, "/dev/pts/")
				})
				if err := sess.WindowChange(40, 120); err != nil {
					t.Fatal(err)
				}
				// A window change travels as a channel request, which x/crypto/ssh hands
				// the server apart from the channel's data, so it may land after the next
				// keystrokes: the shell looks until the new size shows, then prints it (the size is spelled as
				// arithmetic so the PTY's echo of this line cannot satisfy the check).
				_, _ = io.WriteString(stdin, "for i in $(seq 100); do s=$(stty size); [ \"$s\" = \"$((39+1)) $((119+1))\" ] && break; sleep 0.1; done; echo \"$s\"; exit 3\n")
				eventually(t, "40 120", func() bool { return strings.Contains(out.String(), "40 120") })
				var ee *ssh.ExitError
				if err := sess.Wait(); !errors.As(err, &ee) || ee.ExitStatus() != 3 {
					t.Fatalf("shell exit: %v", err)
				}
			})

			t.Run("wrong key refused", func(t *testing.T) {
				other, _ := writeKey(t, t.TempDir(), "id_mallory")
				out, code := w.command(t, time.Minute, "ssh", append(w.sshOpts(other), w.host(), "true")...)
				if code != 255 || !strings.Contains(out, "Permission denied") {
					t.Fatalf("exit %d, output %q", code, out)
				}
			})

			t.Run("another tenant's allocation", func(t *testing.T) {
				ctx := context.Background()
				eve := w.c.env.NewTenant(t, w.c.admin, "Eve "+transport)
				_, err := sshproxy.Dial(ctx, sshproxy.Options{
					BaseURL: w.c.url, Bearer: func(context.Context) (string, error) { return eve.AdminToken, nil },
					ProjectID: eve.DefaultProject, AllocationID: w.alloc.ID,
				})
				var pe *sshproxy.Error
				if !errors.As(err, &pe) || pe.Code != "allocation_not_found" || pe.CorrelationID == "" {
					t.Fatalf("another tenant's allocation: %v", err)
				}
			})
		})
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
