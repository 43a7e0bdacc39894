package packaging

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

// fakeBinary is a stand-in for gantry-nodeagent: any executable works for the layout;
// the simulator's tests (controlplane/internal/maas/maastest) package the real agent.
func fakeBinary(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "gantry-nodeagent")
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho gantry-nodeagent\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func need(t *testing.T, bin string) string {
	t.Helper()
	p, err := exec.LookPath(bin)
	ci.SkipUnlessAvailable(t, bin, err)
	return p
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, stderr.String())
	}
	return string(out)
}

func TestBuildLayoutAndControl(t *testing.T) {
	need(t, "dpkg-deb")
	dir := t.TempDir()
	p, err := WriteFiles(Options{Binary: fakeBinary(t), Version: "v1.4.2", Arch: "amd64"}, dir)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(p) != "gantry-nodeagent_1.4.2_amd64.deb" {
		t.Fatalf("file name %s", p)
	}
	for field, want := range map[string]string{"Package": "gantry-nodeagent", "Version": "1.4.2", "Architecture": "amd64", "Depends": "ca-certificates"} {
		if got := strings.TrimSpace(run(t, "dpkg-deb", "-f", p, field)); got != want {
			t.Errorf("%s = %q, want %q", field, got, want)
		}
	}
	list := run(t, "dpkg-deb", "-c", p)
	for path, mode := range map[string]string{
		"./usr/bin/gantry-nodeagent":                              "-rwxr-xr-x root/root",
		"./lib/systemd/system/gantry-nodeagent.service":           "-rw-r--r-- root/root",
		"./etc/gantry/nodeagent.env":                              "-rw-r--r-- root/root",
		"./usr/share/doc/gantry-nodeagent/nodeagent.conf.example": "-rw-r--r-- root/root",
	} {
		found := false
		for _, line := range strings.Split(list, "\n") {
			if strings.HasSuffix(line, " "+path) {
				found = true
				if !strings.HasPrefix(line, mode) {
					t.Errorf("%s: %q, want mode/owner %q", path, line, mode)
				}
			}
		}
		if !found {
			t.Errorf("%s missing from the package:\n%s", path, list)
		}
	}
	ctl := t.TempDir()
	run(t, "dpkg-deb", "-e", p, ctl)
	conffiles, err := os.ReadFile(filepath.Join(ctl, "conffiles"))
	if err != nil || strings.TrimSpace(string(conffiles)) != EnvFilePath {
		t.Errorf("conffiles = %q, %v; want only %s (an operator's edits survive upgrades)", conffiles, err, EnvFilePath)
	}
	postinst, err := os.ReadFile(filepath.Join(ctl, "postinst"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(postinst), "systemctl enable") {
		t.Errorf("postinst enables the unit before enrollment:\n%s", postinst)
	}
	if err := exec.Command("sh", "-n", filepath.Join(ctl, "postinst")).Run(); err != nil {
		t.Errorf("postinst is not valid sh: %v", err)
	}

	sum, err := os.ReadFile(p + ".sha256")
	if err != nil {
		t.Fatal(err)
	}
	check := exec.Command("sha256sum", "--check", "--strict", filepath.Base(p)+".sha256")
	check.Dir = dir
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("sha256sum --check: %v: %s (file %q)", err, out, sum)
	}
}

// TestUnitVerifies runs systemd-analyze verify on the packaged unit inside the unpacked
// package (the root holds the package's files plus the host's standard targets, so
// After=/WantedBy= resolve and ExecStart must point at the packaged binary).
func TestUnitVerifies(t *testing.T) {
	need(t, "dpkg-deb")
	analyze := need(t, "systemd-analyze")
	dir := t.TempDir()
	p, err := WriteFiles(Options{Binary: fakeBinary(t), Version: "0.0.0-dev"}, dir)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root")
	run(t, "dpkg-deb", "-x", p, root)
	targets, _ := filepath.Glob("/lib/systemd/system/*.target")
	if len(targets) == 0 {
		ci.Missing(t, "no systemd targets in /lib/systemd/system")
	}
	for _, tg := range targets {
		b, err := os.ReadFile(tg)
		if err != nil {
			continue
		}
		if err := os.WriteFile(filepath.Join(root, "lib/systemd/system", filepath.Base(tg)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	verify := func(unit string) (string, error) {
		out, err := exec.Command(analyze, "verify", "--root="+root, filepath.Join(root, "lib/systemd/system", unit)).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := verify("gantry-nodeagent.service"); err != nil || out != "" {
		t.Fatalf("systemd-analyze verify: %v: %s", err, out)
	}
	// The check is real: the unit with the repository's /usr/local/bin path does not
	// verify against the package's files, and neither does a malformed directive.
	bad := strings.Replace(string(Unit()), BinaryPath, "/usr/local/bin/gantry-nodeagent", 1)
	bad2 := strings.Replace(string(Unit()), "Type=simple", "Type=bogus", 1)
	for name, body := range map[string]string{"bad-path.service": bad, "bad-type.service": bad2} {
		if err := os.WriteFile(filepath.Join(root, "lib/systemd/system", name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := verify(name); err == nil && out == "" {
			t.Errorf("%s verified cleanly; the check would not catch a broken unit", name)
		}
	}
}

func TestReproducible(t *testing.T) {
	bin := fakeBinary(t)
	var a, b bytes.Buffer
	if err := Build(Options{Binary: bin, Version: "1.0.0"}, &a); err != nil {
		t.Fatal(err)
	}
	if err := Build(Options{Binary: bin, Version: "1.0.0"}, &b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("two builds of the same inputs differ")
	}
}

func TestBadOptions(t *testing.T) {
	bin := fakeBinary(t)
	for name, o := range map[string]Options{
		"no binary":        {Version: "1.0.0"},
		"missing binary":   {Binary: filepath.Join(t.TempDir(), "nope"), Version: "1.0.0"},
		"directory":        {Binary: t.TempDir(), Version: "1.0.0"},
		"bad version":      {Binary: bin, Version: "latest"},
		"empty version":    {Binary: bin},
		"shell in version": {Binary: bin, Version: "1.0.0;rm"},
	} {
		var buf bytes.Buffer
		if err := Build(o, &buf); err == nil {
			t.Errorf("%s: built a package", name)
		} else if buf.Len() != 0 {
			t.Errorf("%s: wrote %d bytes before failing", name, buf.Len())
		}
	}
	if _, err := RepoRoot("/"); err == nil {
		t.Error("RepoRoot(/) found a go.work")
	}
	if r, err := RepoRoot("."); err != nil || !fileExists(filepath.Join(r, "go.work")) {
		t.Errorf("RepoRoot(.) = %q, %v", r, err)
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }
