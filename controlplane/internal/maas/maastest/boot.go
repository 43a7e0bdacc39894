package maastest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"gopkg.in/yaml.v3"
)

// BootRequest is what a Booter gets when a machine reaches Deployed.
type BootRequest struct {
	SystemID, Hostname string
	// UserData is the decoded user data of the deploy (nil when none was given).
	UserData []byte
	// GPUBackend is the go-nvml mock of the machine's GPUs ("" for none).
	GPUBackend string
}

// Booter boots a deployed machine.
type Booter interface {
	// Boot runs the machine's first boot. dir is where it left its files (reported in
	// Machine.BootDir even when err is set).
	Boot(ctx context.Context, req BootRequest) (inst Instance, dir string, err error)
}

// Instance is a booted machine's running software.
type Instance interface {
	// Stop stops it (power off, release, missing).
	Stop() error
	// Start starts it again after a power cycle: the OS boots and systemd starts the
	// agent; cloud-init does not run a second time.
	Start(ctx context.Context) error
}

// BooterFunc adapts a function to Booter.
type BooterFunc func(ctx context.Context, req BootRequest) (Instance, string, error)

// Boot calls f.
func (f BooterFunc) Boot(ctx context.Context, req BootRequest) (Instance, string, error) {
	return f(ctx, req)
}

// startBoot boots m in the background (called under the lock when m reaches Deployed).
func (s *Server) startBoot(m *machine) {
	if s.cfg.Booter == nil {
		return
	}
	gen := m.gen
	gpu := ""
	if _, ok := GPUModels[m.spec.GPU]; ok {
		gpu = m.spec.GPU
	}
	req := BootRequest{SystemID: m.spec.SystemID, Hostname: m.spec.Hostname, UserData: append([]byte(nil), m.userData...), GPUBackend: gpu}
	go func() {
		inst, dir, err := s.cfg.Booter.Boot(s.ctx, req)
		s.mu.Lock()
		current := !s.closed && m.gen == gen && m.status == StatusDeployed && m.power == "on"
		if m.gen == gen {
			m.bootDir = dir
			if err != nil {
				m.bootErr = err.Error()
			}
		}
		if current && inst != nil {
			m.boot, m.running = inst, true
			inst = nil
		}
		s.mu.Unlock()
		if err != nil {
			s.log.Warn("boot failed", "system_id", req.SystemID, "hostname", req.Hostname, "dir", dir, "error", err)
		} else {
			s.log.Info("booted", "system_id", req.SystemID, "hostname", req.Hostname, "dir", dir)
		}
		if inst != nil { // superseded while booting (released, powered off, closed)
			_ = inst.Stop()
		}
	}()
}

// restart starts m's boot again after a power on (under the lock).
func (s *Server) restart(m *machine) {
	inst := m.boot
	m.running = true
	go func() {
		if err := inst.Start(s.ctx); err != nil {
			s.mu.Lock()
			m.bootErr = err.Error()
			m.running = false
			s.mu.Unlock()
		}
	}()
}

// AgentBooter boots a machine for real, in a sandbox directory: the user data is
// checked with `cloud-init schema`, its write_files are written under the sandbox and
// its runcmd run there with GANTRY_ROOT=<sandbox> (deploy/cloud-init's bootstrap
// fetches the agent package from the control plane, unpacks it and enrolls), and then
// the unpacked gantry-nodeagent runs as its systemd unit would, on the machine's mock
// GPUs. Logs: <sandbox>/var/log/cloud-init-output.log and gantry-nodeagent.log.
type AgentBooter struct {
	// Dir holds the sandboxes (default: a directory under os.TempDir()).
	Dir string
	// Env is added to the bootstrap's and the agent's environment (e.g.
	// GANTRY_NODEAGENT_TRANSPORT=tcp).
	Env []string
	// BootTimeout bounds cloud-init's run (default 10 minutes).
	BootTimeout time.Duration
	// StopTimeout is how long Stop waits after SIGTERM before SIGKILL (default 15 s).
	StopTimeout time.Duration
}

type cloudConfig struct {
	WriteFiles []struct {
		Path        string `yaml:"path"`
		Content     string `yaml:"content"`
		Permissions string `yaml:"permissions"`
		Encoding    string `yaml:"encoding"`
	} `yaml:"write_files"`
	RunCmd []any `yaml:"runcmd"`
}

// Boot implements Booter.
func (b *AgentBooter) Boot(ctx context.Context, req BootRequest) (Instance, string, error) {
	parent := b.Dir
	if parent == "" {
		parent = filepath.Join(os.TempDir(), "maastest-boot")
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, "", err
	}
	dir, err := os.MkdirTemp(parent, req.Hostname+"-")
	if err != nil {
		return nil, "", err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, "", err
	}
	logDir := filepath.Join(dir, "var/log")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, dir, err
	}
	if len(req.UserData) == 0 {
		return nil, dir, errors.New("no user data: nothing installs the agent")
	}
	udPath := filepath.Join(dir, "var/lib/cloud/instance/user-data.txt")
	if err := os.MkdirAll(filepath.Dir(udPath), 0o700); err != nil {
		return nil, dir, err
	}
	if err := os.WriteFile(udPath, req.UserData, 0o600); err != nil {
		return nil, dir, err
	}
	if out, err := exec.CommandContext(ctx, "cloud-init", "schema", "--config-file", udPath).CombinedOutput(); err != nil {
		return nil, dir, fmt.Errorf("cloud-init schema rejects the user data: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if !strings.HasPrefix(string(req.UserData), "#cloud-config") {
		return nil, dir, errors.New("the user data is not a #cloud-config document")
	}
	var cc cloudConfig
	if err := yaml.Unmarshal(req.UserData, &cc); err != nil {
		return nil, dir, fmt.Errorf("user data: %w", err)
	}
	for _, f := range cc.WriteFiles {
		p, err := sandboxPath(dir, f.Path)
		if err != nil {
			return nil, dir, err
		}
		if f.Encoding != "" && f.Encoding != "text/plain" {
			return nil, dir, fmt.Errorf("write_files %s: encoding %q is not simulated", f.Path, f.Encoding)
		}
		mode := os.FileMode(0o644)
		if f.Permissions != "" {
			v, err := strconv.ParseUint(f.Permissions, 8, 32)
			if err != nil {
				return nil, dir, fmt.Errorf("write_files %s: permissions %q", f.Path, f.Permissions)
			}
			mode = os.FileMode(v)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, dir, err
		}
		if err := os.WriteFile(p, []byte(f.Content), mode); err != nil {
			return nil, dir, err
		}
		if err := os.Chmod(p, mode); err != nil {
			return nil, dir, err
		}
	}
	env := b.env(dir, req)
	bootEnv := append(env[:len(env):len(env)], b.Env...)
	logf, err := os.OpenFile(filepath.Join(logDir, "cloud-init-output.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, dir, err
	}
	defer logf.Close()
	timeout := b.BootTimeout
	if timeout == 0 {
		timeout = 10 * time.Minute
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for i, c := range cc.RunCmd {
		var cmd *exec.Cmd
		switch v := c.(type) {
		case string:
			cmd = exec.CommandContext(rctx, "sh", "-c", v)
		case []any:
			argv := make([]string, len(v))
			for j, a := range v {
				argv[j] = fmt.Sprint(a)
			}
			if len(argv) == 0 {
				continue
			}
			if filepath.IsAbs(argv[0]) {
				if p, err := sandboxPath(dir, argv[0]); err == nil {
					if _, err := os.Stat(p); err == nil {
						argv[0] = p
					}
				}
			}
			cmd = exec.CommandContext(rctx, argv[0], argv[1:]...)
		default:
			return nil, dir, fmt.Errorf("runcmd[%d]: not a string or list", i)
		}
		cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, bootEnv, logf, logf
		if err := cmd.Run(); err != nil {
			return nil, dir, fmt.Errorf("runcmd[%d] failed: %v (see %s)", i, err, logf.Name())
		}
	}
	conf := filepath.Join(dir, "etc/gantry/nodeagent.conf")
	bin := filepath.Join(dir, "usr/bin/gantry-nodeagent")
	if _, err := os.Stat(conf); err != nil {
		return nil, dir, fmt.Errorf("cloud-init ran but left no agent configuration: %w", err)
	}
	// The unit's EnvironmentFile, then the simulation's own settings: the machines share
	// this host, so the agent never runs the linux-user runtime (real accounts) here.
	agentEnv := append(append(env[:len(env):len(env)], readEnvFile(filepath.Join(dir, "etc/gantry/nodeagent.env"))...),
		"GANTRY_NODEAGENT_RUNTIME=process")
	agentEnv = append(agentEnv, b.Env...)
	inst := &agentProcess{bin: bin, conf: conf, env: agentEnv, log: filepath.Join(logDir, "gantry-nodeagent.log"), stopTimeout: b.StopTimeout}
	if inst.stopTimeout == 0 {
		inst.stopTimeout = 15 * time.Second
	}
	if err := inst.Start(ctx); err != nil {
		return nil, dir, err
	}
	return inst, dir, nil
}

func (b *AgentBooter) env(dir string, req BootRequest) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GANTRY_") { // nothing of the host's Gantry settings leaks in
			env = append(env, kv)
		}
	}
	env = append(env, "GANTRY_ROOT="+dir,
		"GANTRY_NODEAGENT_STATE_DIR="+filepath.Join(dir, "var/lib/gantry-nodeagent"),
		"GANTRY_NODEAGENT_LOG_SPOOL_DIR="+filepath.Join(dir, "var/lib/gantry-nodeagent/log-spool"),
		"GANTRY_NODEAGENT_HOSTNAME="+req.Hostname)
	if req.GPUBackend != "" {
		env = append(env, "GANTRY_NODEAGENT_GPU_BACKEND="+req.GPUBackend)
	}
	return env
}

// readEnvFile reads KEY=VALUE lines as systemd's EnvironmentFile does (comments and
// blank lines skipped, one level of quotes removed); a missing file is empty.
func readEnvFile(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		out = append(out, strings.TrimSpace(k)+"="+v)
	}
	return out
}

// sandboxPath maps an absolute path of the machine into dir, refusing escapes.
func sandboxPath(dir, p string) (string, error) {
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("path %q is not absolute", p)
	}
	full := filepath.Join(dir, filepath.Clean(p))
	if full != dir && !strings.HasPrefix(full, dir+string(filepath.Separator)) {
		return "", fmt.Errorf("path %q escapes the machine", p)
	}
	return full, nil
}

// agentProcess is the agent running from the sandbox, as gantry-nodeagent.service.
type agentProcess struct {
	bin, conf, log string
	env            []string
	stopTimeout    time.Duration

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

func (a *agentProcess) Start(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd != nil {
		return nil
	}
	logf, err := os.OpenFile(a.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(a.bin, "run", "--config", a.conf)
	cmd.Env, cmd.Stdout, cmd.Stderr = a.env, logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start the agent: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	a.cmd, a.done = cmd, done
	return nil
}

// Stop sends SIGTERM (the agent closes its tunnel with a reason) and SIGKILLs the
// process group if it has not exited within the stop timeout.
func (a *agentProcess) Stop() error {
	a.mu.Lock()
	cmd, done := a.cmd, a.done
	a.cmd, a.done = nil, nil
	a.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
		return nil
	case <-time.After(a.stopTimeout):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return errors.New("the agent did not stop on SIGTERM; killed")
	}
}
