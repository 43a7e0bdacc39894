package apps

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gantry-gpu/gantry/nodeagent/runtime"
	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
)

// proc is a process the supervisor watches: its own child, or one adopted after a
// restart of the agent.
type proc struct {
	pid    int
	exited chan struct{}
	code   int32 // valid once exited is closed; -1 when killed by a signal or unknown
}

// defaultPath is PATH when neither the allocation nor the version sets one.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// logCap bounds an instance's output log; it is truncated when a process starts past it.
const logCap = 16 << 20

// spawn starts the instance's process in env.
func (in *instance) spawn(env runtime.SessionEnv) (*proc, error) {
	cmd, err := in.command(env)
	if err != nil {
		return nil, err
	}
	if in.tail == nil {
		in.tail = &tailBuffer{max: 512}
	}
	var out io.Writer = in.tail
	var logf *os.File
	if in.s.o.StateDir != "" {
		path := filepath.Join(in.s.o.StateDir, "apps", in.spec.GetAppInstanceId()+".log")
		flags := os.O_CREATE | os.O_WRONLY | os.O_APPEND
		if fi, err := os.Stat(path); err == nil && fi.Size() > logCap {
			flags |= os.O_TRUNC
		}
		if f, err := os.OpenFile(path, flags, 0o600); err == nil {
			logf = f
			out = io.MultiWriter(f, in.tail)
		}
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		if logf != nil {
			_ = logf.Close()
		}
		return nil, fmt.Errorf("start %s: %w", in.spec.GetCommand()[0], err)
	}
	p := &proc{pid: cmd.Process.Pid, exited: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		p.code = exitCode(cmd.ProcessState, err)
		if logf != nil {
			_ = logf.Close()
		}
		close(p.exited)
	}()
	return p, nil
}

func exitCode(ps *os.ProcessState, err error) int32 {
	if ps == nil {
		return -1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -1
	}
	if c := ps.ExitCode(); c >= 0 {
		return int32(c)
	}
	_ = err
	return -1
}

// adopt watches a process a previous agent started (not a child of this one) by
// polling it.
func adopt(procDir string, pid int, instanceID string) *proc {
	p := &proc{pid: pid, exited: make(chan struct{}), code: -1}
	go func() {
		for alive(procDir, pid, instanceID) {
			time.Sleep(250 * time.Millisecond)
		}
		close(p.exited)
	}()
	return p
}

// alive reports whether pid is a live (not zombie) process of the instance.
func alive(procDir string, pid int, instanceID string) bool {
	stat, err := os.ReadFile(filepath.Join(procDir, strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses, which may itself hold ')'.
	if i := bytes.LastIndexByte(stat, ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X' {
		return false
	}
	env, err := os.ReadFile(filepath.Join(procDir, strconv.Itoa(pid), "environ"))
	if err != nil {
		return false
	}
	tag := []byte(EnvInstanceID + "=" + instanceID)
	for kv := range bytes.SplitSeq(env, []byte{0}) {
		if bytes.Equal(kv, tag) {
			return true
		}
	}
	return false
}

// vars are the template values of one instance in one allocation.
func (in *instance) vars(env runtime.SessionEnv, instanceDir string) *strings.Replacer {
	spec := in.spec
	uuids := gpuUUIDs(env.Env)
	in.mu.Lock()
	port := in.rec.Port
	in.mu.Unlock()
	return strings.NewReplacer(
		"{port}", strconv.Itoa(int(port)),
		"{gpu_ids}", gpuIndices(len(uuids)),
		"{gpu_uuids}", strings.Join(uuids, ","),
		"{gpu_count}", strconv.Itoa(len(uuids)),
		"{home}", env.Dir,
		"{instance_dir}", instanceDir,
		"{artifacts_dir}", filepath.Join(instanceDir, apptask.ArtifactsDir),
		"{base_path}", spec.GetBasePath(),
		"{app_instance_id}", spec.GetAppInstanceId(),
		"{allocation_id}", spec.GetAllocationId(),
	)
}

// command builds the instance's process: templated argv, the allocation's environment
// plus the version's, its own process group, the allocation's user (and slice).
func (in *instance) command(env runtime.SessionEnv) (*exec.Cmd, error) {
	spec := in.spec
	instanceDir, err := in.dir(env)
	if err != nil {
		return nil, err
	}
	rep := in.vars(env, instanceDir)
	in.mu.Lock()
	port := in.rec.Port
	in.mu.Unlock()

	// The allocation's environment first; the version cannot override it.
	environ := make([]string, 0, len(env.Env)+len(spec.GetEnv())+6)
	fixed := map[string]bool{}
	for _, kv := range env.Env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			continue
		}
		fixed[k] = true
		environ = append(environ, kv)
	}
	own := map[string]string{
		EnvInstanceID:          spec.GetAppInstanceId(),
		"GANTRY_APP_PORT":      strconv.Itoa(int(port)),
		"GANTRY_APP_BASE_PATH": spec.GetBasePath(),
		"GANTRY_APP_DIR":       instanceDir,
		EnvSSHAuthorizedKeys:   trustFile(instanceDir),
	}
	keys := make([]string, 0, len(spec.GetEnv()))
	for k := range spec.GetEnv() {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if fixed[k] || own[k] != "" || k == EnvInstanceID {
			continue
		}
		fixed[k] = true
		environ = append(environ, k+"="+rep.Replace(spec.GetEnv()[k]))
	}
	for _, k := range []string{EnvInstanceID, "GANTRY_APP_PORT", "GANTRY_APP_BASE_PATH", "GANTRY_APP_DIR", EnvSSHAuthorizedKeys} {
		environ = append(environ, k+"="+own[k])
	}
	if !fixed["PATH"] {
		environ = append(environ, "PATH="+defaultPath)
	}
	if !fixed["PORT"] {
		environ = append(environ, "PORT="+strconv.Itoa(int(port)))
	}

	argv := make([]string, len(spec.GetCommand()))
	for i, a := range spec.GetCommand() {
		argv[i] = rep.Replace(a)
	}
	path, err := lookPath(argv[0], lookupEnv(environ, "PATH"))
	if err != nil {
		return nil, err
	}
	args := argv
	attr := &syscall.SysProcAttr{Setpgid: true}
	if env.Slice != "" {
		// systemd-run --scope execs the command itself (same pid) after moving into a
		// scope of the allocation's slice (its device policy) and switching user, so it
		// starts as root without a Credential.
		run, err := exec.LookPath("systemd-run")
		if err != nil {
			return nil, err
		}
		sargs := []string{"systemd-run", "--scope", "--quiet", "--collect", "--slice=" + env.Slice}
		if env.RealUser {
			sargs = append(sargs, "--uid="+strconv.FormatUint(uint64(env.UID), 10), "--gid="+strconv.FormatUint(uint64(env.GID), 10))
		}
		path, args = run, append(append(sargs, "--", path), argv[1:]...)
	} else if env.RealUser {
		cred := &syscall.Credential{Uid: env.UID, Gid: env.GID, Groups: supplementaryGroups(env.UID, env.GID)}
		if os.Geteuid() != 0 {
			cred.NoSetGroups = true
		}
		attr.Credential = cred
	}
	return &exec.Cmd{Path: path, Args: args, Env: environ, Dir: instanceDir, SysProcAttr: attr}, nil
}

// dir makes (when missing) and returns the instance's directory in its allocation's
// home.
func (in *instance) dir(env runtime.SessionEnv) (string, error) {
	home := env.Dir
	if home == "" {
		home = lookupEnv(env.Env, "HOME")
	}
	if home == "" || !filepath.IsAbs(home) {
		return "", fmt.Errorf("the allocation has no absolute home directory (%q)", home)
	}
	dir := instanceDir(home, in.spec.GetAppInstanceId())
	if err := makeInstanceDir(home, dir, env); err != nil {
		return "", fmt.Errorf("instance directory: %w", err)
	}
	return dir, nil
}

// instanceDir is an instance's directory in its allocation's home.
func instanceDir(home, id string) string { return filepath.Join(home, ".gantry", "apps", id) }

// makeInstanceDir creates <home>/.gantry/apps/<id>, owned by the allocation's user.
func makeInstanceDir(home, dir string, env runtime.SessionEnv) error {
	var created []string
	for d := dir; d != home && d != "/" && d != "."; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil {
			break
		}
		created = append(created, d)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	if env.RealUser && os.Geteuid() == 0 {
		for _, d := range created {
			if err := os.Lchown(d, int(env.UID), int(env.GID)); err != nil {
				return err
			}
		}
	}
	return nil
}

func lookupEnv(environ []string, key string) string {
	for i := len(environ) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(environ[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}

// lookPath resolves a command name against the instance's PATH, not the agent's.
func lookPath(name, path string) (string, error) {
	if strings.Contains(name, "/") {
		if !isExecutable(name) {
			return "", &exec.Error{Name: name, Err: exec.ErrNotFound}
		}
		return name, nil
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		if p := filepath.Join(dir, name); isExecutable(p) {
			return p, nil
		}
	}
	return "", &exec.Error{Name: name, Err: exec.ErrNotFound}
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// supplementaryGroups are uid's groups other than gid, never the agent's.
func supplementaryGroups(uid, gid uint32) []uint32 {
	out := []uint32{}
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return out
	}
	ids, err := u.GroupIds()
	if err != nil {
		return out
	}
	for _, s := range ids {
		g, err := strconv.ParseUint(s, 10, 32)
		if err == nil && uint32(g) != gid {
			out = append(out, uint32(g))
		}
	}
	return out
}

// tailBuffer keeps the last max bytes written (the end of an app's output, for the
// message of a failed instance).
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.ToValidUTF8(strings.TrimSpace(string(t.b)), "")
}
