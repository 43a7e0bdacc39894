package runtime

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// LinuxUser is the driver for real hosts (the agent runs as root). An allocation is a
// dedicated account named alloctask.UserName(allocation id):
//
//   - useradd --create-home --home-dir <HomeRoot>/<user> --shell /bin/bash --user-group,
//     with the comment "gantry allocation <id>", which is how the driver recognises its
//     own accounts: an existing account without that comment is never touched;
//   - ~/.ssh (0700) and ~/.ssh/authorized_keys (0600), owned by the user;
//   - ~/.gantry/env (root-owned, 0644) with the allocation's environment, sourced by a
//     managed block at the top of ~/.profile and ~/.bashrc (login shells, interactive
//     shells, and commands sshd runs through bash);
//   - where systemd runs the host and the NVIDIA driver is loaded, a drop-in on the
//     user's slice (<SystemdDir>/user-<uid>.slice.d/50-gantry-gpus.conf) with
//     DevicePolicy=closed that admits only the allocated /dev/nvidiaN (see deviceDropIn).
//
// Lock expires the account and sets its shell to nologin; Kill signals every process
// whose real or effective uid is the user's; Release also removes the slice drop-in, the
// user's files in /tmp, /var/tmp and /dev/shm (a later account may get the same uid),
// and the account with its home (userdel --remove).
//
// Files in the home are written as root into a directory the user controls, so every
// path is resolved inside the home (os.Root: a symlink cannot lead out of it), and files
// are replaced by rename rather than written through, so a planted link never makes
// root write or chown anything else.
type LinuxUser struct {
	// HomeRoot is the parent of the allocation homes (created 0755 when missing).
	HomeRoot string
	// Runner runs useradd, usermod, userdel, getent, find, loginctl and systemctl.
	Runner Runner
	// SystemdDir is where the slice drop-ins go (default /etc/systemd/system).
	SystemdDir string
	// Systemd reports whether systemd runs the host (default: /run/systemd/system
	// exists). Without it there is no device policy and no loginctl.
	Systemd func() bool
	// NvidiaGPUsDir is the driver's per-GPU directory (default /proc/driver/nvidia/gpus),
	// read for each GPU's device minor. Missing means no NVIDIA driver: no device policy.
	NvidiaGPUsDir string
	// ProcDir is /proc (where the processes of a uid are found).
	ProcDir string
	// TmpDirs are scrubbed of the user's files on release (default /tmp, /var/tmp,
	// /dev/shm).
	TmpDirs []string
	Logger  *slog.Logger

	// db serialises commands that change the user database: concurrent useradds on
	// one host contend for /etc/passwd's lock and may fail instead of waiting.
	db sync.Mutex
}

const (
	loginShell   = "/bin/bash"
	dropInName   = "50-gantry-gpus.conf"
	commentStart = "gantry allocation "
)

// Name implements Driver.
func (d *LinuxUser) Name() string { return "linux-user" }

// passwdEntry is one line of `getent passwd`.
type passwdEntry struct {
	Name    string
	UID     uint32
	GID     uint32
	Comment string
	Home    string
	Shell   string
}

// lookup returns the account, or nil when it does not exist.
func (d *LinuxUser) lookup(ctx context.Context, name string) (*passwdEntry, error) {
	res, err := run(ctx, d.Runner, []int{0, 2}, "getent", "passwd", name)
	if err != nil {
		return nil, err
	}
	if res.Exit == 2 {
		return nil, nil
	}
	f := strings.Split(strings.TrimSpace(string(res.Stdout)), ":")
	if len(f) != 7 || f[0] != name {
		return nil, fmt.Errorf("getent passwd %s: unexpected output %q", name, res.Stdout)
	}
	uid, err1 := strconv.ParseUint(f[2], 10, 32)
	gid, err2 := strconv.ParseUint(f[3], 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("getent passwd %s: bad uid/gid in %q", name, res.Stdout)
	}
	return &passwdEntry{Name: f[0], UID: uint32(uid), GID: uint32(gid), Comment: f[4], Home: f[5], Shell: f[6]}, nil
}

// own returns the allocation's account: nil when it does not exist, an error when an
// account of that name exists but is not this allocation's.
func (d *LinuxUser) own(ctx context.Context, s Spec) (*passwdEntry, error) {
	u, err := d.lookup(ctx, s.User)
	if err != nil || u == nil {
		return nil, err
	}
	if u.Comment != commentStart+s.AllocationID {
		return nil, fmt.Errorf("account %s exists and is not allocation %s's (comment %q); not touching it", s.User, s.AllocationID, u.Comment)
	}
	if u.UID == 0 {
		return nil, fmt.Errorf("account %s has uid 0; not touching it", s.User)
	}
	return u, nil
}

func (d *LinuxUser) home(user string) string { return filepath.Join(d.HomeRoot, user) }

// Provision implements Driver.
func (d *LinuxUser) Provision(ctx context.Context, s Spec) (Account, error) {
	if !filepath.IsAbs(d.HomeRoot) {
		return Account{}, fmt.Errorf("home root %q is not absolute", d.HomeRoot)
	}
	u, err := d.ensureAccount(ctx, s)
	if err != nil {
		return Account{}, err
	}
	if err := d.unlock(ctx, u); err != nil {
		return Account{}, err
	}
	env := allocationEnv(s.AllocationID, s.User, u.Home, loginShell, s.GPUs)
	if err := d.writeHome(u, s, env); err != nil {
		return Account{}, fmt.Errorf("writing %s: %w", u.Home, err)
	}
	slice, err := d.applyDevicePolicy(ctx, s, u)
	if err != nil {
		return Account{}, err
	}
	return Account{User: u.Name, RealUser: true, UID: u.UID, GID: u.GID, Home: u.Home, Shell: loginShell, Slice: slice, Env: env}, nil
}

// ensureAccount creates the account unless it exists (a redelivered provision finds the
// account the first run created).
func (d *LinuxUser) ensureAccount(ctx context.Context, s Spec) (*passwdEntry, error) {
	d.db.Lock()
	defer d.db.Unlock()
	u, err := d.own(ctx, s)
	if err != nil {
		return nil, err
	}
	if u == nil {
		if err := os.MkdirAll(d.HomeRoot, 0o755); err != nil {
			return nil, err
		}
		if _, err := run(ctx, d.Runner, nil, "useradd", "--create-home", "--home-dir", d.home(s.User),
			"--shell", loginShell, "--user-group", "--comment", commentStart+s.AllocationID, s.User); err != nil {
			return nil, err
		}
		if u, err = d.own(ctx, s); err != nil {
			return nil, err
		}
		if u == nil {
			return nil, fmt.Errorf("useradd %s succeeded but the account is not there", s.User)
		}
	}
	if u.Home != d.home(s.User) {
		return nil, fmt.Errorf("account %s has home %s, expected %s", s.User, u.Home, d.home(s.User))
	}
	return u, nil
}

// unlock undoes Lock when the account is locked (login shell changed or an expiry date
// set); an unlocked account is left alone.
func (d *LinuxUser) unlock(ctx context.Context, u *passwdEntry) error {
	expire, err := d.expiry(ctx, u.Name)
	if err != nil {
		return err
	}
	if u.Shell == loginShell && expire == "" {
		return nil
	}
	d.db.Lock()
	defer d.db.Unlock()
	_, err = run(ctx, d.Runner, nil, "usermod", "--expiredate", "", "--shell", loginShell, u.Name)
	return err
}

// expiry is the account's expiry field of the shadow database ("" when none).
func (d *LinuxUser) expiry(ctx context.Context, name string) (string, error) {
	res, err := run(ctx, d.Runner, nil, "getent", "shadow", name)
	if err != nil {
		return "", err
	}
	f := strings.Split(strings.TrimSpace(string(res.Stdout)), ":")
	if len(f) != 9 || f[0] != name {
		return "", fmt.Errorf("getent shadow %s: unexpected output", name)
	}
	return f[7], nil
}

// Lock implements Driver: the account expires (sshd and PAM refuse it, keys or not) and
// its shell becomes nologin (for anything that does not check expiry).
func (d *LinuxUser) Lock(ctx context.Context, s Spec) error {
	u, err := d.own(ctx, s)
	if err != nil || u == nil {
		return err
	}
	expire, err := d.expiry(ctx, u.Name)
	if err != nil {
		return err
	}
	shell := nologin()
	if u.Shell == shell && expire == "1" {
		return nil
	}
	d.db.Lock()
	defer d.db.Unlock()
	_, err = run(ctx, d.Runner, nil, "usermod", "--expiredate", "1", "--shell", shell, u.Name)
	return err
}

func nologin() string {
	for _, p := range []string{"/usr/sbin/nologin", "/sbin/nologin"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "/bin/false"
}

// Kill implements Driver. With systemd, the user's login sessions are terminated first
// (so logind does not keep restarting what it manages); then every process of the uid
// gets SIGTERM and, after grace, SIGKILL.
func (d *LinuxUser) Kill(ctx context.Context, s Spec, grace time.Duration) error {
	u, err := d.own(ctx, s)
	if err != nil || u == nil {
		return err
	}
	return d.kill(ctx, u, grace)
}

func (d *LinuxUser) kill(ctx context.Context, u *passwdEntry, grace time.Duration) error {
	if d.systemd() {
		// Exit status 1 means the user has no sessions: nothing to terminate.
		if _, err := run(ctx, d.Runner, []int{0, 1}, "loginctl", "terminate-user", u.Name); err != nil {
			d.logger().Warn("loginctl terminate-user failed; killing the processes directly", "user", u.Name, "err", err)
		}
	}
	return killUID(ctx, d.procDir(), u.UID, grace)
}

// Release implements Driver. The order matters for a retry after a crash: everything
// keyed by the uid (processes, temporary files, the slice drop-in) goes while the account
// still exists to name it, and the account goes last.
func (d *LinuxUser) Release(ctx context.Context, s Spec) error {
	u, err := d.own(ctx, s)
	if err != nil {
		return err
	}
	if u != nil {
		if err := d.Lock(ctx, s); err != nil {
			return err
		}
		if err := d.kill(ctx, u, 0); err != nil {
			return err
		}
		d.scrub(ctx, u)
		if err := d.removeDevicePolicy(ctx, u); err != nil {
			return err
		}
		d.db.Lock()
		// 6: the account is already gone; 12: the home could not be removed (removed
		// below). Anything else fails the release, which the control plane retries.
		_, err := run(ctx, d.Runner, []int{0, 6, 12}, "userdel", "--remove", u.Name)
		d.db.Unlock()
		if err != nil {
			return err
		}
		if left, err := d.lookup(ctx, s.User); err != nil {
			return err
		} else if left != nil {
			return fmt.Errorf("userdel %s: the account is still there", s.User)
		}
	}
	if err := os.RemoveAll(d.home(s.User)); err != nil {
		return fmt.Errorf("removing %s: %w", d.home(s.User), err)
	}
	return nil
}

// scrub removes the user's files from the shared temporary directories, so an account
// created later with the same uid does not inherit them. Best effort: a directory that
// is missing or a file that cannot be removed is logged, not fatal.
func (d *LinuxUser) scrub(ctx context.Context, u *passwdEntry) {
	dirs := d.TmpDirs
	if dirs == nil {
		dirs = []string{"/tmp", "/var/tmp", "/dev/shm"}
	}
	var present []string
	for _, dir := range dirs {
		if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
			present = append(present, dir)
		}
	}
	if len(present) == 0 {
		return
	}
	args := append(present, "-xdev", "-uid", strconv.FormatUint(uint64(u.UID), 10), "-delete")
	if res, err := run(ctx, d.Runner, nil, "find", args...); err != nil {
		d.logger().Warn("removing the user's temporary files", "user", u.Name, "err", err, "stderr", string(res.Stderr))
	}
}

func (d *LinuxUser) systemd() bool {
	if d.Systemd != nil {
		return d.Systemd()
	}
	fi, err := os.Stat("/run/systemd/system")
	return err == nil && fi.IsDir()
}

func (d *LinuxUser) procDir() string {
	if d.ProcDir != "" {
		return d.ProcDir
	}
	return "/proc"
}

func (d *LinuxUser) logger() *slog.Logger {
	if d.Logger != nil {
		return d.Logger
	}
	return slog.New(slog.DiscardHandler)
}
