package terminal

import (
	"bufio"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// SessionEnv is what a terminal needs to know about a live allocation's workload. It
// mirrors nodeagent/runtime's SessionEnv field for field; the agent adapts one to the
// other (EnvironmentsFunc) so this package does not depend on the runtime.
type SessionEnv struct {
	// User is the runtime user name (for logs and, when Shell is empty, the passwd
	// lookup of the login shell).
	User string
	// RealUser says the shell runs as UID/GID (with Groups, or the user's supplementary
	// groups when Groups is nil). When false the shell runs as the agent's own user
	// (the process runtime, development hosts).
	RealUser bool
	UID, GID uint32
	Groups   []uint32
	// Dir is the working directory (the allocation's home); "" means the user's home
	// from Env, else "/".
	Dir string
	// Shell is the login shell; "" means the user's passwd shell, else /bin/bash, else
	// /bin/sh.
	Shell string
	// Env is KEY=VALUE pairs (HOME, USER, CUDA_VISIBLE_DEVICES, ...). The agent's own
	// environment is never passed on; PATH gets a default when Env has none, and TERM
	// always comes from the session.
	Env []string
	// Slice, when set, is the systemd slice that carries the allocation's device policy
	// (only its GPUs' /dev nodes). The shell is started in a transient scope in that
	// slice through systemd-run, which also switches to UID/GID, so the policy applies
	// to everything started from the terminal.
	Slice string
}

// Environments answers which allocations are live on this node.
type Environments interface {
	// Session returns the environment of a provisioned allocation that is neither
	// stopped nor released; false for any other.
	Session(allocationID string) (SessionEnv, bool)
}

// EnvironmentsFunc adapts a function to Environments.
type EnvironmentsFunc func(allocationID string) (SessionEnv, bool)

// Session calls f.
func (f EnvironmentsFunc) Session(allocationID string) (SessionEnv, bool) { return f(allocationID) }

// defaultPath is the PATH of a shell whose environment does not set one (what login(1)
// gives an ordinary user on Debian and Ubuntu, plus the sbin directories).
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// sessionEnviron builds the shell's environment from the allocation's, never from the
// agent's (which may carry the agent's own settings and secrets).
func sessionEnviron(env SessionEnv, term string) []string {
	out := make([]string, 0, len(env.Env)+2)
	hasPath := false
	for _, kv := range env.Env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || k == "TERM" {
			continue
		}
		if k == "PATH" {
			hasPath = true
		}
		out = append(out, kv)
	}
	if !hasPath {
		out = append(out, "PATH="+defaultPath)
	}
	return append(out, "TERM="+term)
}

func lookupEnv(environ []string, key string) string {
	for i := len(environ) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(environ[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}

// buildCommand returns the process a session runs: argv from the preamble, or the
// login shell (argv[0] "-bash", the login(1) convention every shell understands).
func buildCommand(env SessionEnv, argv []string, term string) (*exec.Cmd, error) {
	environ := sessionEnviron(env, term)
	dir := env.Dir
	if dir == "" {
		dir = lookupEnv(environ, "HOME")
	}
	if dir == "" {
		dir = "/"
	}
	var path string
	var args []string
	if len(argv) > 0 {
		p, err := lookPath(argv[0], lookupEnv(environ, "PATH"))
		if err != nil {
			return nil, err
		}
		path, args = p, append([]string(nil), argv...)
	} else {
		path = loginShell(env)
		args = []string{"-" + filepath.Base(path)}
	}
	// Setsid + Setctty: the shell leads a new session with the PTY as its controlling
	// terminal (job control, SIGHUP on hangup, SIGWINCH on resize).
	attr := &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if env.Slice != "" {
		// systemd-run --scope execs the shell itself (same pid, same PTY) after moving
		// into a scope in the slice and switching user with initgroups, so it must start
		// as root: no Credential here.
		run, err := exec.LookPath("systemd-run")
		if err != nil {
			return nil, err
		}
		path, args = run, scopeArgs(env, path, argv)
	} else if env.RealUser {
		cred := &syscall.Credential{Uid: env.UID, Gid: env.GID, Groups: env.Groups}
		if cred.Groups == nil {
			cred.Groups = supplementaryGroups(env.UID, env.GID)
		}
		// Without CAP_SETGID setgroups fails even for an empty list; an unprivileged agent
		// can only "switch" to itself, which needs no group change.
		if os.Geteuid() != 0 {
			cred.NoSetGroups = true
		}
		attr.Credential = cred
	}
	return &exec.Cmd{Path: path, Args: args, Env: environ, Dir: dir, SysProcAttr: attr}, nil
}

// scopeArgs is the systemd-run command line that runs path (argv, or a login shell when
// argv is empty) in a transient scope of env.Slice as the allocation's user.
func scopeArgs(env SessionEnv, path string, argv []string) []string {
	args := []string{"systemd-run", "--scope", "--quiet", "--collect", "--slice=" + env.Slice}
	if env.RealUser {
		args = append(args, "--uid="+strconv.FormatUint(uint64(env.UID), 10), "--gid="+strconv.FormatUint(uint64(env.GID), 10))
	}
	args = append(args, "--", path)
	if len(argv) == 0 {
		// A login shell's "-bash" argv[0] cannot pass through systemd-run; -l means the
		// same to bash, zsh, dash and busybox sh.
		return append(args, "-l")
	}
	return append(args, argv[1:]...)
}

// supplementaryGroups are the groups of uid other than gid (e.g. video), never the
// agent's: an empty list clears the agent's groups in the child.
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

// loginShell picks the shell of a session started without a command.
func loginShell(env SessionEnv) string {
	if env.Shell != "" {
		return env.Shell
	}
	name := env.User
	if name == "" && !env.RealUser {
		if u, err := user.Current(); err == nil {
			name = u.Username
		}
	}
	if sh := passwdShell("/etc/passwd", name); sh != "" && isExecutable(sh) {
		return sh
	}
	if isExecutable("/bin/bash") {
		return "/bin/bash"
	}
	return "/bin/sh"
}

// passwdShell reads the shell field of name's line in a passwd file.
func passwdShell(file, name string) string {
	if name == "" {
		return ""
	}
	f, err := os.Open(file)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) == 7 && fields[0] == name {
			return fields[6]
		}
	}
	return ""
}

// lookPath resolves a command name against the session's PATH, not the agent's.
func lookPath(name, path string) (string, error) {
	if strings.Contains(name, "/") {
		if !isExecutable(name) {
			return "", &exec.Error{Name: name, Err: exec.ErrNotFound}
		}
		return name, nil
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue // never resolve against the agent's working directory
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
