package terminal_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	nodeterm "github.com/gantry-gpu/gantry/nodeagent/terminal"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"github.com/gantry-gpu/gantry/shared/sshproxy"
)

// TestSSHAcrossReplicas: an SSH connection whose WebSocket lands on replica rb while ra
// holds the node's tunnel goes through the terminal relay (which takes SSH preambles):
// the command runs in the allocation and its exit status comes back; the connection is
// audited once.
func TestSSHAcrossReplicas(t *testing.T) {
	w := newWorld(t)
	runFabric(t, w.App)
	runTerminal(t, w.App, w.Server.URL)
	node := w.agentNode(t, w.App, fabricnet.ModeTCP, nodeterm.Options{})
	a := w.activeAllocation(t, node.id, node)
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(node.sshKeys, ssh.MarshalAuthorizedKey(signer.PublicKey()), 0o600); err != nil {
		t.Fatal(err)
	}

	b, srvB := w.secondReplica(t, "rb")
	runFabric(t, b)
	runTerminal(t, b, srvB.URL)
	eventually(t, "replica rb to see the node on ra", func() bool {
		p, ok, err := b.Fabric.Presence(context.Background(), node.id)
		return err == nil && ok && p.Online && p.Replica == "ra"
	})
	conn, err := sshproxy.Dial(context.Background(), sshproxy.Options{
		BaseURL: srvB.URL, Bearer: func(context.Context) (string, error) { return w.Acme.AdminToken, nil },
		ProjectID: w.Acme.DefaultProject, AllocationID: a.ID,
	})
	if err != nil {
		t.Fatal(err)
	}
	sc, chans, reqs, err := ssh.NewClientConn(conn, "alloc", &ssh.ClientConfig{
		User: "gantry-test", Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: ssh.InsecureIgnoreHostKey(),
	})
	if err != nil {
		t.Fatal(err)
	}
	client := ssh.NewClient(sc, chans, reqs)
	sess, err := client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	out, err := sess.CombinedOutput("echo via-$((2*3))-rb; exit 4")
	var ee *ssh.ExitError
	if !errors.As(err, &ee) || ee.ExitStatus() != 4 || !strings.Contains(string(out), "via-6-rb") {
		t.Fatalf("across replicas: %v %q", err, out)
	}
	// The replica that took the WebSocket counts the connection and its bytes while it
	// lasts; the one that only holds the tunnel counts none.
	if v := metricValue(t, b, "ssh_websockets_active", "", ""); v != 1 {
		t.Fatalf("rb ssh_websockets_active %v during the connection, want 1", v)
	}
	_ = client.Close()
	if n := w.count(t, `SELECT count(*) FROM audit_events WHERE action = 'allocation.ssh.connect' AND target_id = $1`, a.ID.String()); n != 1 {
		t.Fatalf("audited %d times, want 1", n)
	}
	if v := metricValue(t, b, "ssh_connections_total", "outcome", "opened"); v != 1 {
		t.Fatalf("rb ssh_connections_total{opened} = %v, want 1", v)
	}
	if v := metricValue(t, w.App, "ssh_connections_total", "outcome", "opened"); v != 0 {
		t.Fatalf("ra ssh_connections_total{opened} = %v, want 0 (it only holds the tunnel)", v)
	}
	for _, dir := range []string{"to_node", "from_node"} {
		if v := metricValue(t, b, "ssh_bytes_total", "direction", dir); v < 100 {
			t.Fatalf("rb ssh_bytes_total{%s} = %v, want the SSH handshake's bytes at least", dir, v)
		}
	}
	eventually(t, "rb's ssh_websockets_active back to 0", func() bool { return metricValue(t, b, "ssh_websockets_active", "", "") == 0 })
}
