// Package config is the node agent's configuration: one small key = value file written
// by `gantry-nodeagent enroll` (default /etc/gantry/nodeagent.conf), every key
// overridable by an environment variable GANTRY_NODEAGENT_<KEY> (upper-case), and two
// files beside it: the node bearer token (0600, never in the config file or the
// environment) and the fabric CA certificate.
//
// The format is deliberately the simplest that works with shell tools and systemd:
// one `key = value` per line, `#` starts a comment line, blank lines are ignored, a
// value may be wrapped in double quotes. Unknown keys are an error, so a typo is not
// silently ignored.
package config

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gantry-gpu/gantry/nodeagent/internal/atomicfile"
)

// DefaultPath is where the agent looks for its configuration.
const DefaultPath = "/etc/gantry/nodeagent.conf"

// EnvPrefix prefixes every environment override; EnvConfigPath names the file itself.
const (
	EnvPrefix     = "GANTRY_NODEAGENT_"
	EnvConfigPath = EnvPrefix + "CONFIG"
)

// Limits on what the agent reads.
const (
	maxFileBytes  = 64 << 10
	maxValueBytes = 4096
	maxTokenBytes = 4096
	maxCABytes    = 256 << 10
)

// Config is the agent's configuration after file and environment are merged.
type Config struct {
	// ServerURL is the control plane's REST base URL (https://cp.example), used by
	// enroll and by the log shipper.
	ServerURL string
	// NodeID is this node's id (UUID), returned by enrollment.
	NodeID string
	// FabricAddr is the fabric's host:port (QUIC and TLS+TCP share the port number).
	FabricAddr string
	// FabricServerName overrides the TLS server name checked on the fabric certificate
	// (default: FabricAddr's host).
	FabricServerName string
	// TokenFile holds the node bearer token (mode 0600). Relative paths are relative to
	// the config file's directory.
	TokenFile string
	// CAFile holds the fabric CA certificate (PEM). Relative as TokenFile.
	CAFile string
	// Transport is auto, quic or tcp.
	Transport string
	// GPUBackend is nvml or one of the mocks (mock-h100, mock-a100, mock-h200, mock-b200).
	GPUBackend string
	// Hostname reported to the control plane (default: os.Hostname).
	Hostname string
	// TelemetryInterval is used until the control plane chooses one (Welcome).
	TelemetryInterval time.Duration
	// LogLevel is debug, info, warn or error.
	LogLevel string
	// LogGatewayURL, when set, ships the agent's logs to the node log gateway
	// (nodeagent/logship) with the node token.
	LogGatewayURL string
	// LogSpoolDir keeps log batches on disk until the gateway has them (empty: memory).
	LogSpoolDir string

	// Runtime is how allocations exist on this host (nodeagent/runtime): "process"
	// (unprivileged workspaces, for development), "linux-user" (a dedicated account per
	// allocation; root) or "auto" (process on a mock GPU backend, linux-user on nvml).
	Runtime string
	// StateDir holds the runtime's allocation records and the process runtime's
	// workspaces. Empty means "state"; relative paths are relative to the config file's
	// directory.
	StateDir string
	// HomeRoot is the parent of the linux-user runtime's home directories.
	HomeRoot string
	// AdvertiseHost is the host name users connect to over SSH (default: Hostname, else
	// the system's).
	AdvertiseHost string
	// SSHPort is the SSH port reported with the connection details.
	SSHPort int
	// StopGrace is how long a stop waits between SIGTERM and SIGKILL.
	StopGrace time.Duration

	// TerminalDetachedTimeout ends a browser terminal session nobody has been attached
	// to for this long (nodeagent/terminal).
	TerminalDetachedTimeout time.Duration

	// StorageMode is how buckets are attached into allocations (nodeagent/storagemount):
	// "auto" (FUSE when /dev/fuse is usable, else copy), "fuse" or "copy".
	StorageMode string
	// StorageSyncInterval spaces the upload of changes in rw copy-mode attachments.
	StorageSyncInterval time.Duration

	// Path is the file this was loaded from ("" when none).
	Path string
}

// Default is the configuration before any file or environment is read.
func Default() Config {
	return Config{
		TokenFile:         "node-token",
		CAFile:            "fabric-ca.pem",
		Transport:         "auto",
		GPUBackend:        "nvml",
		TelemetryInterval: 15 * time.Second,
		LogLevel:          "info",
		Runtime:           "auto",
		HomeRoot:          "/home/gantry",
		SSHPort:           22,
		StopGrace:         10 * time.Second,

		TerminalDetachedTimeout: 5 * time.Minute,
		StorageMode:             "auto",
		StorageSyncInterval:     60 * time.Second,
	}
}

// field binds a key to a Config field.
type field struct {
	get func(*Config) string
	set func(*Config, string) error
}

func str(p func(*Config) *string) field {
	return field{
		get: func(c *Config) string { return *p(c) },
		set: func(c *Config, v string) error { *p(c) = v; return nil },
	}
}

var fields = map[string]field{
	"server_url":         str(func(c *Config) *string { return &c.ServerURL }),
	"node_id":            str(func(c *Config) *string { return &c.NodeID }),
	"fabric_addr":        str(func(c *Config) *string { return &c.FabricAddr }),
	"fabric_server_name": str(func(c *Config) *string { return &c.FabricServerName }),
	"token_file":         str(func(c *Config) *string { return &c.TokenFile }),
	"ca_file":            str(func(c *Config) *string { return &c.CAFile }),
	"transport":          str(func(c *Config) *string { return &c.Transport }),
	"gpu_backend":        str(func(c *Config) *string { return &c.GPUBackend }),
	"hostname":           str(func(c *Config) *string { return &c.Hostname }),
	"log_level":          str(func(c *Config) *string { return &c.LogLevel }),
	"log_gateway_url":    str(func(c *Config) *string { return &c.LogGatewayURL }),
	"log_spool_dir":      str(func(c *Config) *string { return &c.LogSpoolDir }),
	"runtime":            str(func(c *Config) *string { return &c.Runtime }),
	"state_dir":          str(func(c *Config) *string { return &c.StateDir }),
	"home_root":          str(func(c *Config) *string { return &c.HomeRoot }),
	"advertise_host":     str(func(c *Config) *string { return &c.AdvertiseHost }),
	"ssh_port": {
		get: func(c *Config) string { return strconv.Itoa(c.SSHPort) },
		set: func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 65535 {
				return fmt.Errorf("not a port number (1-65535)")
			}
			c.SSHPort = n
			return nil
		},
	},
	"stop_grace": {
		get: func(c *Config) string { return c.StopGrace.String() },
		set: func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < time.Second || d > 10*time.Minute {
				return fmt.Errorf("not a duration between 1s and 10m")
			}
			c.StopGrace = d
			return nil
		},
	},
	"storage_mode": str(func(c *Config) *string { return &c.StorageMode }),
	"storage_sync_interval": {
		get: func(c *Config) string { return c.StorageSyncInterval.String() },
		set: func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < time.Second || d > 24*time.Hour {
				return fmt.Errorf("not a duration between 1s and 24h")
			}
			c.StorageSyncInterval = d
			return nil
		},
	},
	"terminal_detached_timeout": {
		get: func(c *Config) string { return c.TerminalDetachedTimeout.String() },
		set: func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < 10*time.Second || d > 24*time.Hour {
				return fmt.Errorf("not a duration between 10s and 24h")
			}
			c.TerminalDetachedTimeout = d
			return nil
		},
	},
	"telemetry_interval": {
		get: func(c *Config) string { return c.TelemetryInterval.String() },
		set: func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < time.Second || d > time.Hour {
				return fmt.Errorf("not a duration between 1s and 1h")
			}
			c.TelemetryInterval = d
			return nil
		},
	},
}

// Keys lists every configuration key, sorted (for docs and `--help`).
func Keys() []string {
	ks := make([]string, 0, len(fields))
	for k := range fields {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// EnvName is the environment variable that overrides key.
func EnvName(key string) string { return EnvPrefix + strings.ToUpper(key) }

// Load reads path (which may be missing when missingOK) and applies environment
// overrides from getenv (os.LookupEnv in production).
func Load(path string, missingOK bool, getenv func(string) (string, bool)) (Config, error) {
	c := Default()
	if path != "" {
		b, err := readLimited(path, maxFileBytes)
		switch {
		case err == nil:
			if err := c.parse(b); err != nil {
				return Config{}, fmt.Errorf("config %s: %w", path, err)
			}
			c.Path = path
		case errors.Is(err, os.ErrNotExist) && missingOK:
		default:
			return Config{}, err
		}
	}
	for _, k := range Keys() {
		if v, ok := getenv(EnvName(k)); ok && v != "" {
			if err := c.setKey(k, v); err != nil {
				return Config{}, fmt.Errorf("%s: %w", EnvName(k), err)
			}
		}
	}
	return c, nil
}

func (c *Config) parse(b []byte) error {
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), maxFileBytes)
	seen := map[string]bool{}
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return fmt.Errorf("line %d: want key = value", n)
		}
		k = strings.TrimSpace(k)
		v = strings.TrimSpace(v)
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = v[1 : len(v)-1]
		}
		if seen[k] {
			return fmt.Errorf("line %d: %s set twice", n, k)
		}
		seen[k] = true
		if err := c.setKey(k, v); err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
	}
	return sc.Err()
}

func (c *Config) setKey(k, v string) error {
	f, ok := fields[k]
	if !ok {
		return fmt.Errorf("unknown key %q", k)
	}
	if len(v) > maxValueBytes {
		return fmt.Errorf("%s: value longer than %d bytes", k, maxValueBytes)
	}
	if strings.ContainsAny(v, "\n\r\x00") {
		return fmt.Errorf("%s: control characters in value", k)
	}
	if err := f.set(c, v); err != nil {
		return fmt.Errorf("%s: %w", k, err)
	}
	return nil
}

// Marshal renders c in the file format (every key, sorted).
func (c Config) Marshal() []byte {
	var b bytes.Buffer
	b.WriteString("# gantry-nodeagent configuration (written by `gantry-nodeagent enroll`).\n")
	b.WriteString("# Every key can be overridden by GANTRY_NODEAGENT_<KEY>. See docs/nodeagent.md.\n")
	for _, k := range Keys() {
		fmt.Fprintf(&b, "%s = %s\n", k, fields[k].get(&c))
	}
	return b.Bytes()
}

// Save writes c to path atomically (mode 0644: nothing in it is secret).
func Save(path string, c Config) error {
	return writeAtomic(path, c.Marshal(), 0o644)
}

// Validate checks what `run` needs: an enrolled node with a fabric address.
func (c Config) Validate() error {
	var missing []string
	for k, v := range map[string]string{"node_id": c.NodeID, "fabric_addr": c.FabricAddr, "token_file": c.TokenFile, "ca_file": c.CAFile} {
		if v == "" {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Errorf("config: %s not set (has this host been enrolled? run `gantry-nodeagent enroll`)", strings.Join(missing, ", "))
	}
	switch c.Transport {
	case "auto", "quic", "tcp":
	default:
		return fmt.Errorf("config: transport %q is not auto, quic or tcp", c.Transport)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("config: log_level %q is not debug, info, warn or error", c.LogLevel)
	}
	switch c.Runtime {
	case "auto", "process", "linux-user":
	default:
		return fmt.Errorf("config: runtime %q is not auto, process or linux-user", c.Runtime)
	}
	switch c.StorageMode {
	case "auto", "fuse", "copy":
	default:
		return fmt.Errorf("config: storage_mode %q is not auto, fuse or copy", c.StorageMode)
	}
	if c.HomeRoot == "" || !filepath.IsAbs(c.HomeRoot) {
		return fmt.Errorf("config: home_root %q is not an absolute path", c.HomeRoot)
	}
	return nil
}

// Resolve returns p relative to the config file's directory when p is relative.
func (c Config) Resolve(p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	dir := filepath.Dir(DefaultPath)
	if c.Path != "" {
		dir = filepath.Dir(c.Path)
	}
	// Absolute, so that what is derived from it stays right whatever the working
	// directory later is: a mount point, an os.Root on a home (storage attachments
	// refuse a relative home) and the paths handed to a child process.
	joined := filepath.Join(dir, p)
	if abs, err := filepath.Abs(joined); err == nil {
		return abs
	}
	return joined
}

// ReadToken reads the node token. Like ssh with private keys, it refuses a token file
// that group or others can read.
func (c Config) ReadToken() (string, error) {
	p := c.Resolve(c.TokenFile)
	fi, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("node token: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("node token %s: mode %#o is readable by others; chmod 600 it", p, fi.Mode().Perm())
	}
	b, err := readLimited(p, maxTokenBytes)
	if err != nil {
		return "", fmt.Errorf("node token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("node token %s is empty", p)
	}
	return tok, nil
}

// WriteToken stores the node token with mode 0600.
func (c Config) WriteToken(token string) error {
	return writeAtomic(c.Resolve(c.TokenFile), []byte(token+"\n"), 0o600)
}

// WriteCA stores the fabric CA certificate (PEM).
func (c Config) WriteCA(pem []byte) error {
	if _, err := parseCA(pem); err != nil {
		return err
	}
	return writeAtomic(c.Resolve(c.CAFile), pem, 0o644)
}

// TLSConfig trusts only the fabric CA. The fabric package adds ALPN and TLS 1.3.
func (c Config) TLSConfig() (*tls.Config, error) {
	b, err := readLimited(c.Resolve(c.CAFile), maxCABytes)
	if err != nil {
		return nil, fmt.Errorf("fabric CA: %w", err)
	}
	pool, err := parseCA(b)
	if err != nil {
		return nil, err
	}
	// The session cache lets a reconnect resume the last tunnel's TLS session instead
	// of verifying the server's certificate chain again (docs/fabric.md, reconnects):
	// every dial clones this config, and the clones share the cache.
	return &tls.Config{RootCAs: pool, ServerName: c.FabricServerName, MinVersion: tls.VersionTLS13,
		ClientSessionCache: tls.NewLRUClientSessionCache(4)}, nil
}

func parseCA(pem []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("fabric CA: no PEM certificate found")
	}
	return pool, nil
}

func readLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return b, nil
}

// writeAtomic writes through a temporary file in the same directory and renames it, so
// a crash never leaves a half-written token or config. The directory is created 0755.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return atomicfile.Write(path, data, mode)
}
