package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func write(t *testing.T, dir, name, body string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadFileAndEnv(t *testing.T) {
	dir := t.TempDir()
	p := write(t, dir, "nodeagent.conf", `
# comment
server_url = https://cp.example
node_id = 0190f6a0-0000-7000-8000-000000000001
fabric_addr = "cp.example:7443"
gpu_backend = mock-h100
telemetry_interval = 30s
state_dir = /var/lib/gantry-nodeagent
advertise_host = ssh.gpu-01.example
`, 0o644)
	c, err := Load(p, false, env(map[string]string{
		"GANTRY_NODEAGENT_TRANSPORT":   "tcp",
		"GANTRY_NODEAGENT_GPU_BACKEND": "mock-a100",
		"GANTRY_NODEAGENT_HOSTNAME":    "", // empty does not override
		"GANTRY_NODEAGENT_RUNTIME":     "process",
		"GANTRY_NODEAGENT_SSH_PORT":    "2222",
		"GANTRY_NODEAGENT_STOP_GRACE":  "3s",
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.ServerURL = "https://cp.example"
	want.NodeID = "0190f6a0-0000-7000-8000-000000000001"
	want.FabricAddr = "cp.example:7443"
	want.GPUBackend = "mock-a100"
	want.Transport = "tcp"
	want.TelemetryInterval = 30 * time.Second
	want.StateDir, want.AdvertiseHost = "/var/lib/gantry-nodeagent", "ssh.gpu-01.example"
	want.Runtime, want.SSHPort, want.StopGrace = "process", 2222, 3*time.Second
	want.Path = p
	if c != want {
		t.Fatalf("got %+v\nwant %+v", c, want)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := c.Resolve(c.TokenFile); got != filepath.Join(dir, "node-token") {
		t.Fatalf("token path %s", got)
	}
	if got := c.Resolve("/abs/ca.pem"); got != "/abs/ca.pem" {
		t.Fatalf("abs path %s", got)
	}
}

func TestLoadRejects(t *testing.T) {
	cases := map[string]string{
		"unknown key":    "nodeid = x\n",
		"no equals":      "server_url https://x\n",
		"twice":          "node_id = a\nnode_id = b\n",
		"bad duration":   "telemetry_interval = soon\n",
		"short interval": "telemetry_interval = 10ms\n",
		"long value":     "hostname = " + strings.Repeat("h", maxValueBytes+1) + "\n",
		"ssh port text":  "ssh_port = ssh\n",
		"ssh port zero":  "ssh_port = 0\n",
		"ssh port big":   "ssh_port = 65536\n",
		"grace short":    "stop_grace = 10ms\n",
		"grace long":     "stop_grace = 1h\n",
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			p := write(t, t.TempDir(), "c.conf", body, 0o644)
			if _, err := Load(p, false, env(nil)); err == nil {
				t.Fatal("accepted")
			}
		})
	}
	if _, err := Load(filepath.Join(t.TempDir(), "none"), false, env(nil)); err == nil {
		t.Fatal("missing file accepted")
	}
	if _, err := Load(filepath.Join(t.TempDir(), "none"), true, env(nil)); err != nil {
		t.Fatal("missing file with missingOK:", err)
	}
	if _, err := Load("", true, env(map[string]string{"GANTRY_NODEAGENT_TELEMETRY_INTERVAL": "x"})); err == nil {
		t.Fatal("bad env accepted")
	}
	big := write(t, t.TempDir(), "big.conf", strings.Repeat("# pad\n", maxFileBytes/6+10), 0o644)
	if _, err := Load(big, false, env(nil)); err == nil {
		t.Fatal("oversized file accepted")
	}
}

func TestValidate(t *testing.T) {
	c := Default()
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "fabric_addr, node_id") {
		t.Fatalf("err = %v", err)
	}
	c.NodeID, c.FabricAddr = "n", "a:1"
	c.Transport = "udp"
	if err := c.Validate(); err == nil {
		t.Fatal("bad transport accepted")
	}
	c.Transport = "auto"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.Runtime = "docker"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "runtime") {
		t.Fatalf("bad runtime: %v", err)
	}
	c.Runtime = "linux-user"
	c.HomeRoot = "homes"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "home_root") {
		t.Fatalf("relative home_root: %v", err)
	}
}

func TestSaveRoundTrip(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "sub", "nodeagent.conf")
	c := Default()
	c.ServerURL, c.NodeID, c.FabricAddr, c.Hostname = "https://cp", "id", "cp:7443", "gpu-01"
	c.Runtime, c.StateDir, c.HomeRoot, c.AdvertiseHost = "linux-user", "/var/lib/gantry-nodeagent", "/srv/homes", "ssh.gpu-01"
	c.SSHPort, c.StopGrace = 2222, 30*time.Second
	if err := Save(p, c); err != nil {
		t.Fatal(err)
	}
	got, err := Load(p, false, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	c.Path = p
	if got != c {
		t.Fatalf("round trip: %+v != %+v", got, c)
	}
}

func TestTokenFileMode(t *testing.T) {
	dir := t.TempDir()
	c := Default()
	c.Path = filepath.Join(dir, "nodeagent.conf")
	if err := c.WriteToken("gnt_secret"); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, "node-token"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("token mode %#o", fi.Mode().Perm())
	}
	tok, err := c.ReadToken()
	if err != nil || tok != "gnt_secret" {
		t.Fatalf("token %q, %v", tok, err)
	}
	// Rewriting keeps 0600 (atomic replace, not an in-place write).
	if err := c.WriteToken("gnt_rotated"); err != nil {
		t.Fatal(err)
	}
	if tok, _ := c.ReadToken(); tok != "gnt_rotated" {
		t.Fatalf("token %q", tok)
	}
	if err := os.Chmod(filepath.Join(dir, "node-token"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadToken(); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("world-readable token accepted: %v", err)
	}
}

func TestCAAndTLSConfig(t *testing.T) {
	dir := t.TempDir()
	c := Default()
	c.Path = filepath.Join(dir, "nodeagent.conf")
	c.FabricServerName = "fabric.gantry.internal"
	if err := c.WriteCA([]byte("not pem")); err == nil {
		t.Fatal("garbage CA accepted")
	}
	if err := c.WriteCA(selfSigned(t)); err != nil {
		t.Fatal(err)
	}
	tc, err := c.TLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	if tc.RootCAs == nil || tc.ServerName != "fabric.gantry.internal" {
		t.Fatalf("tls config %+v", tc)
	}
	// Reconnects resume the last tunnel's TLS session (docs/fabric.md, "Reconnect CPU").
	if tc.ClientSessionCache == nil {
		t.Fatal("no TLS session cache: every reconnect would verify the certificate chain again")
	}
}

func selfSigned(t *testing.T) []byte {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"}, IsCA: true,
		BasicConstraintsValid: true, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
