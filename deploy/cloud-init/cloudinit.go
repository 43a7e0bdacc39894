// Package cloudinit renders the user data MAAS hands a machine it deploys for Gantry: a
// #cloud-config document (user-data.yaml.tmpl) that writes the one-time enrollment token
// (0600), the control plane's CA and the bootstrap settings, and runs gantry-bootstrap.sh,
// which fetches the node agent package and its checksum from the control plane,
// installs it, enrolls and enables the systemd unit.
//
// Every value is checked before it is written: URLs are http(s) without quoting or
// whitespace characters, the token and hostname are from fixed alphabets. Nothing a
// caller passes can break out of the YAML or of the shell variables it lands in.
package cloudinit

import (
	"bytes"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"text/template"
)

//go:embed user-data.yaml.tmpl
var userDataTemplate string

// Script is gantry-bootstrap.sh, the program the user data runs.
//
//go:embed gantry-bootstrap.sh
var Script string

// Paths of the package and checksum on the control plane (PATHS.md).
const (
	PackagePath  = "/api/v1/node-agent/package"
	ChecksumPath = "/api/v1/node-agent/package.sha256"
)

// Params are the per-machine values.
type Params struct {
	// ControlPlaneURL is the REST base the agent enrolls with (https://cp.example).
	ControlPlaneURL string
	// PackageURL and ChecksumURL default to ControlPlaneURL + PackagePath/ChecksumPath.
	PackageURL, ChecksumURL string
	// PackageSHA256, when set, pins the package: the served checksum must equal it.
	PackageSHA256 string
	// ServerCAPEM is the CA (PEM) the machine trusts for the control plane's HTTPS,
	// pinning it instead of the system roots; empty uses the system roots.
	ServerCAPEM string
	// EnrollmentToken is the node's one-time enrollment token.
	EnrollmentToken string
	// LogGatewayURL is where the agent ships its logs (optional).
	LogGatewayURL string
	// Hostname is the name the agent reports (optional; default the machine's own).
	Hostname string
	// Transport is auto, quic or tcp (optional).
	Transport string
	// Runtime is the agent's allocation runtime: auto, process or linux-user (optional;
	// written to /etc/gantry/nodeagent.env as GANTRY_NODEAGENT_RUNTIME).
	Runtime string
}

var (
	tokenRE    = regexp.MustCompile(`^[A-Za-z0-9._~+/=-]{1,256}$`)
	hostnameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`)
	sha256RE   = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

func checkURL(name, v string, required bool) error {
	if v == "" {
		if required {
			return fmt.Errorf("cloudinit: %s is required", name)
		}
		return nil
	}
	if len(v) > 2048 || strings.ContainsAny(v, "'\"`$\\ \t\r\n") {
		return fmt.Errorf("cloudinit: %s has characters a URL must not carry", name)
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil {
		return fmt.Errorf("cloudinit: %s must be http(s)://host[:port][/path]", name)
	}
	return nil
}

// Validate checks p (after defaults) without rendering.
func (p Params) withDefaults() Params {
	base := strings.TrimRight(p.ControlPlaneURL, "/")
	if p.PackageURL == "" && base != "" {
		p.PackageURL = base + PackagePath
	}
	if p.ChecksumURL == "" && base != "" {
		p.ChecksumURL = base + ChecksumPath
	}
	p.ControlPlaneURL = base
	return p
}

func (p Params) validate() error {
	for _, u := range []struct {
		name, v  string
		required bool
	}{{"control-plane URL", p.ControlPlaneURL, true}, {"package URL", p.PackageURL, true}, {"checksum URL", p.ChecksumURL, true}, {"log gateway URL", p.LogGatewayURL, false}} {
		if err := checkURL(u.name, u.v, u.required); err != nil {
			return err
		}
	}
	if !tokenRE.MatchString(p.EnrollmentToken) {
		return errors.New("cloudinit: the enrollment token must be 1-256 characters of [A-Za-z0-9._~+/=-]")
	}
	if p.Hostname != "" && (len(p.Hostname) > 253 || !hostnameRE.MatchString(p.Hostname)) {
		return errors.New("cloudinit: the hostname is not a DNS name")
	}
	if p.PackageSHA256 != "" && !sha256RE.MatchString(p.PackageSHA256) {
		return errors.New("cloudinit: the package checksum must be 64 lower-case hex digits")
	}
	switch p.Transport {
	case "", "auto", "quic", "tcp":
	default:
		return errors.New("cloudinit: the transport must be auto, quic or tcp")
	}
	switch p.Runtime {
	case "", "auto", "process", "linux-user":
	default:
		return errors.New("cloudinit: the runtime must be auto, process or linux-user")
	}
	if p.ServerCAPEM != "" {
		rest := []byte(p.ServerCAPEM)
		n := 0
		for {
			var b *pem.Block
			b, rest = pem.Decode(rest)
			if b == nil {
				break
			}
			if b.Type != "CERTIFICATE" {
				return errors.New("cloudinit: the server CA holds a PEM block that is not a certificate")
			}
			n++
		}
		if n == 0 || len(bytes.TrimSpace(rest)) != 0 {
			return errors.New("cloudinit: the server CA is not a PEM certificate bundle")
		}
	}
	return nil
}

var tmpl = template.Must(template.New("user-data").Funcs(template.FuncMap{
	"quote": func(s string) string { b, _ := json.Marshal(s); return string(b) }, // a JSON string is a YAML double-quoted scalar
	"indent": func(n int, s string) string {
		pad := strings.Repeat(" ", n)
		lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
		for i, l := range lines {
			if l != "" {
				lines[i] = pad + l
			}
		}
		return strings.Join(lines, "\n")
	},
}).Parse(userDataTemplate))

// Render returns the #cloud-config document for p.
func Render(p Params) ([]byte, error) {
	p = p.withDefaults()
	if err := p.validate(); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	err := tmpl.Execute(&buf, struct {
		Params
		Script string
	}{p, Script})
	return buf.Bytes(), err
}

// UserData is Render's document base64-encoded, as MAAS's deploy wants user_data.
func UserData(p Params) (string, error) {
	doc, err := Render(p)
	if err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(doc), nil
}
