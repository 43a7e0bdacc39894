package e2e_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
)

// TestCLINodeOffline: the allocation's node agent stops; `gantry terminal` and
// `gantry ssh-proxy` (what `gantry ssh` runs) then end with the API's node_offline, its
// correlation id, a hint that says the node is offline, and exit code 6 (a conflict), not a
// hang or a stack trace.
func TestCLINodeOffline(t *testing.T) {
	w := startCLIWorld(t)
	u := newCLIUser(t, w.c.url)
	if _, errOut, code := u.run(apitest.Password+"\n", "login", "-u", w.tenant.AdminUsername, "--password-stdin"); code != 0 {
		t.Fatalf("login: exit %d\n%s", code, errOut)
	}
	// An allocation needs a key on the account; only its public half matters here.
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	pubFile := filepath.Join(u.home, "far.pub")
	if err := os.WriteFile(pubFile, ssh.MarshalAuthorizedKey(sp), 0o644); err != nil {
		t.Fatal(err)
	}
	u.ok("ssh-key", "add", pubFile)
	if out, errOut, code := u.run("", "alloc", "create", "--sku", e2eSKU, "--name", "far", "--wait"); code != 0 {
		t.Fatalf("alloc create --wait: exit %d\n%s\n%s", code, out, errOut)
	}
	if _, errOut, code := u.run("", "terminal", "far", "--", "true"); code != 0 {
		t.Fatalf("terminal while the node is online: exit %d\n%s", code, errOut)
	}

	if err := w.agent.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = w.agent.Wait()

	// The control plane notices the tunnel is gone; until then a terminal may still open.
	var errOut string
	eventually(t, "terminal refused with node_offline", func() bool {
		var code int
		_, errOut, code = u.run("", "terminal", "far", "--", "true")
		return code != 0 && strings.Contains(errOut, "code: node_offline")
	})
	check := func(what string, args ...string) {
		t.Helper()
		errOut := u.fails(6, "node_offline", args...)
		if !strings.Contains(errOut, "Hint: the allocation's node is offline") {
			t.Fatalf("%s: no offline hint:\n%s", what, errOut)
		}
	}
	check("terminal", "terminal", "far", "--", "true")
	check("ssh-proxy", "ssh-proxy", "far")
}
