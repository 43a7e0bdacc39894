// Package packaging builds the node agent's Debian package with nfpm: the
// gantry-nodeagent binary, its systemd unit (deploy/systemd/gantry-nodeagent.service with
// the binary in /usr/bin, where a package puts it) and a default environment file. It
// only assembles files; building the binary is the caller's (or BuildAgent's) job.
//
// The package never enables or starts the unit on its own: an agent without an
// enrollment has nothing to connect to. Enrollment and `systemctl enable --now` are the
// installer's step (cloud-init's runcmd, deploy/cloud-init, or install-nodeagent.sh).
package packaging

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/goreleaser/nfpm/v2"
	"github.com/goreleaser/nfpm/v2/deb"
	"github.com/goreleaser/nfpm/v2/files"

	"github.com/gantry-gpu/gantry/deploy"
)

// Package name and the paths it installs.
const (
	Name        = "gantry-nodeagent"
	BinaryPath  = "/usr/bin/gantry-nodeagent"
	UnitPath    = "/lib/systemd/system/gantry-nodeagent.service"
	EnvFilePath = "/etc/gantry/nodeagent.env"
	ExamplePath = "/usr/share/doc/gantry-nodeagent/nodeagent.conf.example"
)

// Options describe one package.
type Options struct {
	// Binary is a gantry-nodeagent built for linux/Arch.
	Binary string
	// Version is the package version (a semver like 1.4.0 or 0.0.0-dev; a leading v is
	// dropped).
	Version string
	// Arch is the Debian architecture (amd64, arm64); default amd64.
	Arch string
	// MTime stamps every file and the archive members, so the same inputs give the same
	// bytes; zero means 2000-01-01 (SOURCE_DATE_EPOCH is not consulted).
	MTime time.Time
}

var versionRE = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+([-+~][0-9A-Za-z.+~-]*)?$`)

// Unit is the systemd unit the package installs: the repository's unit with ExecStart
// pointing at /usr/bin.
func Unit() []byte {
	return bytes.ReplaceAll(deploy.NodeAgentUnit, []byte("/usr/local/bin/gantry-nodeagent"), []byte(BinaryPath))
}

// envFile is the packaged default environment file (a conffile: an operator's edits
// survive upgrades). Every setting is commented out: the agent's defaults apply and the
// enrolled configuration (/etc/gantry/nodeagent.conf, written by `enroll`) wins.
const envFile = `# Environment for gantry-nodeagent.service (read by systemd; see docs/nodeagent.md).
# Every key of /etc/gantry/nodeagent.conf can be overridden as GANTRY_NODEAGENT_<KEY>.
# The configuration itself is written by "gantry-nodeagent enroll".
#
#GANTRY_NODEAGENT_TRANSPORT=tcp
#GANTRY_NODEAGENT_LOG_LEVEL=info
#GANTRY_NODEAGENT_RUNTIME=linux-user
#HTTPS_PROXY=http://proxy.example:3128
`

// exampleConf documents the keys enrollment writes (docs/nodeagent.md has them all).
const exampleConf = `# /etc/gantry/nodeagent.conf is written by:
#   GANTRY_NODEAGENT_ENROLLMENT_TOKEN=... gantry-nodeagent enroll --server https://cp.example
# It looks like this (key = value; unknown keys are an error):
server_url = "https://cp.example"
node_id = "00000000-0000-0000-0000-000000000000"
fabric_addr = "cp.example:7443"
token_file = "node-token"
ca_file = "fabric-ca.pem"
transport = "auto"
gpu_backend = "nvml"
runtime = "auto"
log_gateway_url = "https://logs.cp.example"
`

const postinst = `#!/bin/sh
set -e
# Pick up the new or changed unit; never enable or start it here (enrollment first).
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
	# An upgrade restarts an agent that was running.
	if [ "$1" = "configure" ] && [ -n "$2" ] && systemctl is-active --quiet gantry-nodeagent.service; then
		systemctl restart gantry-nodeagent.service || true
	fi
fi
`

const prerm = `#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ "$1" = "remove" ]; then
	systemctl stop gantry-nodeagent.service >/dev/null 2>&1 || true
	systemctl disable gantry-nodeagent.service >/dev/null 2>&1 || true
fi
`

const postrm = `#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
if [ "$1" = "purge" ]; then
	rm -rf /var/lib/gantry-nodeagent
fi
`

// Build writes the .deb to w.
func Build(o Options, w io.Writer) error {
	if o.Binary == "" {
		return errors.New("packaging: no binary given")
	}
	if st, err := os.Stat(o.Binary); err != nil {
		return fmt.Errorf("packaging: %w", err)
	} else if !st.Mode().IsRegular() {
		return fmt.Errorf("packaging: %s is not a regular file", o.Binary)
	}
	version := strings.TrimPrefix(o.Version, "v")
	if !versionRE.MatchString(version) {
		return fmt.Errorf("packaging: version %q is not MAJOR.MINOR.PATCH[-pre]", o.Version)
	}
	arch := o.Arch
	if arch == "" {
		arch = "amd64"
	}
	mtime := o.MTime
	if mtime.IsZero() {
		mtime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	dir, err := os.MkdirTemp("", "gantry-package-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	write := func(name string, data []byte) (string, error) {
		p := filepath.Join(dir, name)
		return p, os.WriteFile(p, data, 0o644)
	}
	unit, err := write("unit", Unit())
	if err != nil {
		return err
	}
	env, err := write("env", []byte(envFile))
	if err != nil {
		return err
	}
	example, err := write("example", []byte(exampleConf))
	if err != nil {
		return err
	}
	scripts := map[string]string{}
	for name, body := range map[string]string{"postinst": postinst, "prerm": prerm, "postrm": postrm} {
		p, err := write(name, []byte(body))
		if err != nil {
			return err
		}
		scripts[name] = p
	}
	fi := func(mode os.FileMode) *files.ContentFileInfo {
		return &files.ContentFileInfo{Owner: "root", Group: "root", Mode: mode, MTime: mtime}
	}
	info := &nfpm.Info{
		Name:        Name,
		Arch:        arch,
		Platform:    "linux",
		Version:     version,
		Section:     "admin",
		Priority:    "optional",
		Maintainer:  "Gantry <gantry@example.invalid>",
		Description: "Gantry node agent\nGPU inventory, telemetry and allocation tasks over one outbound tunnel to the Gantry control plane.",
		Vendor:      "Gantry",
		Homepage:    "https://github.com/gantry-gpu/gantry",
		License:     "Proprietary",
		MTime:       mtime,
		Overridables: nfpm.Overridables{
			Depends: []string{"ca-certificates"},
			Contents: files.Contents{
				{Source: o.Binary, Destination: BinaryPath, FileInfo: fi(0o755)},
				{Source: unit, Destination: UnitPath, FileInfo: fi(0o644)},
				{Source: env, Destination: EnvFilePath, Type: files.TypeConfigNoReplace, FileInfo: fi(0o644)},
				{Source: example, Destination: ExamplePath, FileInfo: fi(0o644)},
				{Destination: "/etc/gantry", Type: files.TypeDir, FileInfo: fi(0o755)},
			},
			Scripts: nfpm.Scripts{PostInstall: scripts["postinst"], PreRemove: scripts["prerm"], PostRemove: scripts["postrm"]},
		},
	}
	info = nfpm.WithDefaults(info)
	return deb.Default.Package(info, w)
}

// FileName is the Debian file name of a package: gantry-nodeagent_<version>_<arch>.deb.
func FileName(version, arch string) string {
	if arch == "" {
		arch = "amd64"
	}
	return fmt.Sprintf("%s_%s_%s.deb", Name, strings.TrimPrefix(version, "v"), arch)
}

// WriteFiles builds the package into dir and writes its SHA-256 beside it in
// sha256sum's format ("<hex>  <name>\n", <name>.sha256). It returns the package path.
func WriteFiles(o Options, dir string) (string, error) {
	var buf bytes.Buffer
	if err := Build(o, &buf); err != nil {
		return "", err
	}
	name := FileName(o.Version, o.Arch)
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p+".tmp", buf.Bytes(), 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		return "", err
	}
	sum := sha256.Sum256(buf.Bytes())
	if err := os.WriteFile(p+".sha256", []byte(hex.EncodeToString(sum[:])+"  "+name+"\n"), 0o644); err != nil {
		return "", err
	}
	return p, nil
}

// BuildAgent compiles gantry-nodeagent from the repository at root (the directory with
// go.work) into dir with the version stamped in, for linux/arch. cgo stays on: the
// NVML bindings need it.
func BuildAgent(ctx context.Context, root, dir, version, arch string) (string, error) {
	if arch == "" {
		arch = "amd64"
	}
	out := filepath.Join(dir, "gantry-nodeagent")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-X main.version="+strings.TrimPrefix(version, "v"),
		"-o", out, "./nodeagent/cmd/gantry-nodeagent")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH="+arch)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build gantry-nodeagent: %w: %s", err, bytes.TrimSpace(b))
	}
	return out, nil
}

// RepoRoot walks up from dir to the directory holding go.work.
func RepoRoot(dir string) (string, error) {
	d, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.work")); err == nil {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("no go.work above %s", dir)
		}
		d = parent
	}
}
