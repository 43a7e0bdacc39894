package apps_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/nodeagent/tasks"
	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
)

var keyA, keyB = newKey("worker-0"), newKey("worker-1")

// newKey is a fresh ed25519 public key as an authorized_keys line.
func newKey(comment string) string {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		panic(err)
	}
	pk, err := ssh.NewPublicKey(pub)
	if err != nil {
		panic(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pk))) + " " + comment
}

func (n *node) trust(p apptask.BootstrapSSH) tasks.Result {
	n.t.Helper()
	b, _ := json.Marshal(p)
	return n.mux.Execute(context.Background(), tasks.Task{ID: uuid.NewString(), Kind: apptask.KindBootstrapSSH, Payload: b, ContentType: apptask.ContentTypeJSON, Attempt: 1})
}

// TestBootstrapSSHTrust: app.bootstrap_ssh writes exactly the trusted keys to the
// instance's authorized_keys (0600, the file the app is told about), a repeat changes
// nothing, a revoke removes it; malformed keys and payloads are refused, trusting in an
// allocation that is not live fails, revoking there succeeds.
func TestBootstrapSSHTrust(t *testing.T) {
	n := newNode(t)
	alloc := n.allocation(0)
	s := spec(t, alloc, "http")
	if res := n.run(apptask.KindStart, s); res.Status != tasks.Succeeded {
		t.Fatalf("start: %+v", res)
	}
	in := n.waitState(s.AppInstanceId, apptask.StateRunning)
	file := filepath.Join(n.dir, "allocations", alloc, "home", ".gantry", "apps", s.AppInstanceId, ".ssh", "authorized_keys")
	if info := get(t, in.Port, "/info"); !strings.Contains(info, "GANTRY_APP_SSH_AUTHORIZED_KEYS="+file+"\n") {
		t.Fatalf("the app is not told where its trust lives:\n%s", info)
	}

	p := apptask.BootstrapSSH{AppInstanceID: s.AppInstanceId, AllocationID: alloc, State: apptask.TrustTrusted, PublicKeys: []string{keyA, keyB}}
	for range 2 {
		if res := n.trust(p); res.Status != tasks.Succeeded {
			t.Fatalf("trust: %+v", res)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) != 3 || lines[1] != keyA || lines[2] != keyB {
			t.Fatalf("authorized_keys:\n%s", b)
		}
		if fi, _ := os.Stat(file); fi.Mode().Perm() != 0o600 {
			t.Fatalf("mode %v", fi.Mode())
		}
	}
	p.PublicKeys = []string{keyB}
	if res := n.trust(p); res.Status != tasks.Succeeded {
		t.Fatalf("narrow trust: %+v", res)
	}
	if b, _ := os.ReadFile(file); strings.Contains(string(b), keyA) || !strings.Contains(string(b), keyB) {
		t.Fatalf("after narrowing:\n%s", b)
	}

	for name, c := range map[string]struct {
		p    apptask.BootstrapSSH
		code string
	}{
		"bad key":          {apptask.BootstrapSSH{AppInstanceID: s.AppInstanceId, AllocationID: alloc, State: apptask.TrustTrusted, PublicKeys: []string{"ssh-ed25519 notbase64"}}, apptask.CodeInvalidPayload},
		"unknown state":    {apptask.BootstrapSSH{AppInstanceID: s.AppInstanceId, AllocationID: alloc, State: "maybe"}, apptask.CodeInvalidPayload},
		"other allocation": {apptask.BootstrapSSH{AppInstanceID: s.AppInstanceId, AllocationID: uuid.NewString(), State: apptask.TrustTrusted}, apptask.CodeAllocationMismatch},
		"not live":         {apptask.BootstrapSSH{AppInstanceID: uuid.NewString(), AllocationID: uuid.NewString(), State: apptask.TrustTrusted, PublicKeys: []string{keyA}}, apptask.CodeAllocationNotActive},
	} {
		if res := n.trust(c.p); res.Status != tasks.Failed || res.ErrorCode != c.code {
			t.Errorf("%s: %+v, want %s", name, res, c.code)
		}
	}
	tooMany := make([]string, apptask.MaxTrustedKeys+1)
	for i := range tooMany {
		tooMany[i] = keyA
	}
	if res := n.trust(apptask.BootstrapSSH{AppInstanceID: s.AppInstanceId, AllocationID: alloc, State: apptask.TrustTrusted, PublicKeys: tooMany}); res.ErrorCode != apptask.CodeInvalidPayload {
		t.Fatalf("33 keys: %+v", res)
	}
	if res := n.trust(apptask.BootstrapSSH{AppInstanceID: s.AppInstanceId, AllocationID: alloc, State: apptask.TrustTrusted, PublicKeys: tooMany[:apptask.MaxTrustedKeys]}); res.Status != tasks.Succeeded {
		t.Fatalf("32 keys: %+v", res)
	}
	if b, _ := os.ReadFile(file); !strings.Contains(string(b), keyA) {
		t.Fatalf("a refused request changed the trust:\n%s", b)
	}

	p.State = apptask.TrustRevoked // the keys it still carries are ignored
	for range 2 {
		if res := n.trust(p); res.Status != tasks.Succeeded {
			t.Fatalf("revoke: %+v", res)
		}
		if _, err := os.Stat(file); !os.IsNotExist(err) {
			t.Fatalf("authorized_keys after revoke: %v", err)
		}
	}
	if res := n.trust(apptask.BootstrapSSH{AppInstanceID: uuid.NewString(), AllocationID: uuid.NewString(), State: apptask.TrustRevoked}); res.Status != tasks.Succeeded {
		t.Fatalf("revoke in a gone allocation: %+v", res)
	}
}
