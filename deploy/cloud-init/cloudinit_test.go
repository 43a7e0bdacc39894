package cloudinit

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gantry-gpu/gantry/deploy/packaging"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

func testCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gantry test CA"},
		NotBefore: time.Unix(0, 0), NotAfter: time.Unix(0, 0).Add(100 * 365 * 24 * time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

type cloudConfig struct {
	WriteFiles []struct {
		Path        string `yaml:"path"`
		Owner       string `yaml:"owner"`
		Permissions string `yaml:"permissions"`
		Content     string `yaml:"content"`
	} `yaml:"write_files"`
	RunCmd [][]string `yaml:"runcmd"`
}

func parse(t *testing.T, doc []byte) (cloudConfig, map[string]string, map[string]string) {
	t.Helper()
	if !bytes.HasPrefix(doc, []byte("#cloud-config\n")) {
		t.Fatalf("no #cloud-config header:\n%s", doc)
	}
	var cc cloudConfig
	if err := yaml.Unmarshal(doc, &cc); err != nil {
		t.Fatalf("not YAML: %v\n%s", err, doc)
	}
	files, perms := map[string]string{}, map[string]string{}
	for _, f := range cc.WriteFiles {
		files[f.Path], perms[f.Path] = f.Content, f.Permissions
	}
	return cc, files, perms
}

// schema runs the real `cloud-init schema` on doc.
func schema(t *testing.T, doc []byte) error {
	t.Helper()
	bin, err := exec.LookPath("cloud-init")
	ci.SkipUnlessAvailable(t, "cloud-init (Debian package cloud-init)", err)
	f := filepath.Join(t.TempDir(), "user-data")
	if err := os.WriteFile(f, doc, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "schema", "--config-file", f).CombinedOutput()
	if err != nil {
		return &schemaError{string(out)}
	}
	return nil
}

type schemaError struct{ out string }

func (e *schemaError) Error() string { return e.out }

func TestRenderPassesCloudInitSchema(t *testing.T) {
	ca := testCA(t)
	for name, p := range map[string]Params{
		"minimal": {ControlPlaneURL: "https://cp.example", EnrollmentToken: "gnt_enroll_abc"},
		"full": {ControlPlaneURL: "https://cp.example:8443/", ServerCAPEM: ca, EnrollmentToken: "gnt_enroll_abc.DEF-123",
			LogGatewayURL: "https://logs.cp.example", Hostname: "gpu-rack1-07", Transport: "tcp", Runtime: "linux-user",
			PackageSHA256: strings.Repeat("ab", 32)},
	} {
		t.Run(name, func(t *testing.T) {
			doc, err := Render(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := schema(t, doc); err != nil {
				t.Fatalf("cloud-init schema rejects the user data: %v\n%s", err, doc)
			}
			cc, files, perms := parse(t, doc)
			if got := files["/etc/gantry/enrollment-token"]; got != p.EnrollmentToken {
				t.Errorf("token file = %q", got)
			}
			if perms["/etc/gantry/enrollment-token"] != "0600" || perms["/etc/gantry/bootstrap.env"] != "0600" {
				t.Errorf("permissions %v", perms)
			}
			if strings.Count(string(doc), p.EnrollmentToken) != 1 {
				t.Error("the enrollment token appears outside its file")
			}
			if files["/usr/local/sbin/gantry-bootstrap"] != Script {
				t.Error("the bootstrap script does not round-trip through the YAML")
			}
			if (files["/etc/gantry/server-ca.pem"] != "") != (p.ServerCAPEM != "") || (p.ServerCAPEM != "" && files["/etc/gantry/server-ca.pem"] != p.ServerCAPEM) {
				t.Errorf("server CA = %q", files["/etc/gantry/server-ca.pem"])
			}
			env := files["/etc/gantry/bootstrap.env"]
			base := strings.TrimRight(p.ControlPlaneURL, "/")
			for _, want := range []string{"GANTRY_SERVER_URL='" + base + "'", "GANTRY_PACKAGE_URL='" + base + PackagePath + "'",
				"GANTRY_PACKAGE_SHA256_URL='" + base + ChecksumPath + "'"} {
				if !strings.Contains(env, want+"\n") {
					t.Errorf("bootstrap.env lacks %s:\n%s", want, env)
				}
			}
			if len(cc.RunCmd) != 1 || len(cc.RunCmd[0]) != 1 || cc.RunCmd[0][0] != "/usr/local/sbin/gantry-bootstrap" {
				t.Errorf("runcmd = %v", cc.RunCmd)
			}
			ud, err := UserData(p)
			if err != nil {
				t.Fatal(err)
			}
			if dec, err := base64.StdEncoding.DecodeString(ud); err != nil || !bytes.Equal(dec, doc) {
				t.Error("UserData is not the base64 of Render")
			}
		})
	}
}

// TestSchemaCheckIsReal: the same check rejects a document cloud-init cannot use, so a
// passing run above means something.
func TestSchemaCheckIsReal(t *testing.T) {
	if err := schema(t, []byte("#cloud-config\nwrite_files: 7\nruncmd: {a: b}\n")); err == nil {
		t.Fatal("cloud-init schema accepted an invalid document")
	}
}

func TestRenderRefusesBadValues(t *testing.T) {
	ok := Params{ControlPlaneURL: "https://cp.example", EnrollmentToken: "tok"}
	for name, mut := range map[string]func(*Params){
		"no url":           func(p *Params) { p.ControlPlaneURL = "" },
		"ftp url":          func(p *Params) { p.ControlPlaneURL = "ftp://cp.example" },
		"quote in url":     func(p *Params) { p.ControlPlaneURL = "https://cp.example/'; rm -rf /'" },
		"dollar in url":    func(p *Params) { p.LogGatewayURL = "https://x/$(id)" },
		"newline in url":   func(p *Params) { p.PackageURL = "https://x/\nruncmd: [reboot]" },
		"userinfo":         func(p *Params) { p.ControlPlaneURL = "https://u:p@cp.example" },
		"no token":         func(p *Params) { p.EnrollmentToken = "" },
		"token newline":    func(p *Params) { p.EnrollmentToken = "a\nb" },
		"token too long":   func(p *Params) { p.EnrollmentToken = strings.Repeat("a", 257) },
		"bad hostname":     func(p *Params) { p.Hostname = "gpu 1" },
		"hostname quote":   func(p *Params) { p.Hostname = "a'b" },
		"bad transport":    func(p *Params) { p.Transport = "udp" },
		"bad runtime":      func(p *Params) { p.Runtime = "docker; reboot" },
		"bad sha":          func(p *Params) { p.PackageSHA256 = "ABC" },
		"ca not pem":       func(p *Params) { p.ServerCAPEM = "hello" },
		"ca with key":      func(p *Params) { p.ServerCAPEM = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n" },
		"ca trailing junk": func(p *Params) { p.ServerCAPEM = testCA(t) + "junk: [x]\n" },
	} {
		p := ok
		mut(&p)
		if doc, err := Render(p); err == nil {
			t.Errorf("%s: rendered\n%s", name, doc)
		}
	}
	if _, err := Render(ok); err != nil {
		t.Fatal(err)
	}
}

// fakeAgent is a gantry-nodeagent stand-in for the bootstrap test: it records its
// arguments and the token it got from the environment.
const fakeAgent = `#!/bin/sh
dir="$(dirname "$0")/../../record"
mkdir -p "$dir"
printf '%s\n' "$@" > "$dir/args"
printf '%s' "$GANTRY_NODEAGENT_ENROLLMENT_TOKEN" > "$dir/token"
[ "$FAKE_AGENT_FAIL" = 1 ] && exit 3
echo "enrolled node 1234"
`

// TestBootstrapScriptInSandbox runs gantry-bootstrap.sh from the rendered user data
// the way the simulator does (GANTRY_ROOT): package and checksum from an HTTP server,
// checksum and pin checks, dpkg-deb -x, enrollment with the token from its file, and
// the token file gone afterwards, on success and on failure.
func TestBootstrapScriptInSandbox(t *testing.T) {
	for _, bin := range []string{"dpkg-deb", "curl", "sha256sum", "bash"} {
		_, err := exec.LookPath(bin)
		ci.SkipUnlessAvailable(t, bin, err)
	}
	bin := filepath.Join(t.TempDir(), "gantry-nodeagent")
	if err := os.WriteFile(bin, []byte(fakeAgent), 0o755); err != nil {
		t.Fatal(err)
	}
	var deb bytes.Buffer
	if err := packaging.Build(packaging.Options{Binary: bin, Version: "1.2.3"}, &deb); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(deb.Bytes())
	good := hex.EncodeToString(sum[:])
	served := good
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case PackagePath:
			w.Write(deb.Bytes())
		case ChecksumPath:
			w.Write([]byte(served + "  gantry-nodeagent_1.2.3_amd64.deb\n"))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()

	boot := func(t *testing.T, p Params, env ...string) (string, string, error) {
		t.Helper()
		doc, err := Render(p)
		if err != nil {
			t.Fatal(err)
		}
		_, files, perms := parse(t, doc)
		root := t.TempDir()
		for path, content := range files {
			mode := os.FileMode(0o644)
			switch perms[path] {
			case "0600":
				mode = 0o600
			case "0755":
				mode = 0o755
			}
			full := filepath.Join(root, path)
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(full, []byte(content), mode); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command("bash", filepath.Join(root, "usr/local/sbin/gantry-bootstrap"))
		cmd.Env = append(append(os.Environ(), "GANTRY_ROOT="+root), env...)
		out, err := cmd.CombinedOutput()
		if _, serr := os.Stat(filepath.Join(root, "etc/gantry/enrollment-token")); !os.IsNotExist(serr) {
			t.Errorf("the enrollment token file is still there (%v)\n%s", serr, out)
		}
		return root, string(out), err
	}
	p := Params{ControlPlaneURL: srv.URL, EnrollmentToken: "gnt_enroll_sandbox", Hostname: "gpu-07", LogGatewayURL: "http://logs.example:3100"}

	t.Run("installs and enrolls", func(t *testing.T) {
		root, out, err := boot(t, p)
		if err != nil {
			t.Fatalf("bootstrap: %v\n%s", err, out)
		}
		if st, err := os.Stat(filepath.Join(root, "usr/bin/gantry-nodeagent")); err != nil || st.Mode()&0o111 == 0 {
			t.Fatalf("agent not installed: %v", err)
		}
		if _, err := os.Stat(filepath.Join(root, "lib/systemd/system/gantry-nodeagent.service")); err != nil {
			t.Fatalf("unit not installed: %v", err)
		}
		args, _ := os.ReadFile(filepath.Join(root, "record/args"))
		token, _ := os.ReadFile(filepath.Join(root, "record/token"))
		want := "enroll\n--config\n" + root + "/etc/gantry/nodeagent.conf\n--server\n" + srv.URL + "\n--log-gateway\nhttp://logs.example:3100\n--hostname\ngpu-07\n"
		if string(args) != want {
			t.Errorf("agent args:\n%s\nwant:\n%s", args, want)
		}
		if string(token) != p.EnrollmentToken {
			t.Errorf("agent got token %q", token)
		}
		if strings.Contains(out, p.EnrollmentToken) {
			t.Error("the token appears in the bootstrap output")
		}
		if env, _ := os.ReadFile(filepath.Join(root, "etc/gantry/nodeagent.env")); strings.Contains(string(env), "\nGANTRY_NODEAGENT_RUNTIME=") {
			t.Errorf("a runtime was written although none was given:\n%s", env)
		}
	})
	t.Run("runtime", func(t *testing.T) {
		q := p
		q.Runtime = "linux-user"
		root, out, err := boot(t, q)
		if err != nil {
			t.Fatalf("bootstrap: %v\n%s", err, out)
		}
		env, _ := os.ReadFile(filepath.Join(root, "etc/gantry/nodeagent.env"))
		if !strings.HasSuffix(string(env), "\nGANTRY_NODEAGENT_RUNTIME=linux-user\n") || !strings.HasPrefix(string(env), "# Environment for gantry-nodeagent.service") {
			t.Errorf("nodeagent.env:\n%s", env)
		}
	})
	t.Run("pinned checksum matches", func(t *testing.T) {
		q := p
		q.PackageSHA256 = good
		if _, out, err := boot(t, q); err != nil {
			t.Fatalf("bootstrap: %v\n%s", err, out)
		}
	})
	t.Run("pinned checksum differs", func(t *testing.T) {
		q := p
		q.PackageSHA256 = strings.Repeat("0", 64)
		root, out, err := boot(t, q)
		if err == nil || !strings.Contains(out, "is not the one this machine was deployed for") {
			t.Fatalf("bootstrap accepted another package: %v\n%s", err, out)
		}
		if _, err := os.Stat(filepath.Join(root, "usr/bin/gantry-nodeagent")); !os.IsNotExist(err) {
			t.Error("installed anyway")
		}
	})
	t.Run("corrupt package", func(t *testing.T) {
		served = strings.Repeat("1", 64)
		defer func() { served = good }()
		root, out, err := boot(t, p)
		if err == nil || !strings.Contains(out, "package checksum mismatch") {
			t.Fatalf("bootstrap accepted a package with the wrong checksum: %v\n%s", err, out)
		}
		if _, err := os.Stat(filepath.Join(root, "usr/bin/gantry-nodeagent")); !os.IsNotExist(err) {
			t.Error("installed anyway")
		}
	})
	t.Run("enrollment fails", func(t *testing.T) {
		_, out, err := boot(t, p, "FAKE_AGENT_FAIL=1")
		if err == nil {
			t.Fatalf("bootstrap succeeded although enroll failed\n%s", out)
		}
	})
}
