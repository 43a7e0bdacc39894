package runtime

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/shared/alloctask"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

// requireRoot skips the test when not root, except under CI=true, where it fails: the
// linux-user runtime is only tested for real (useradd, userdel, runuser).
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		ci.Missing(t, "the linux-user runtime tests need root")
	}
}

type linuxUserEnv struct {
	dir    string // state dir
	homes  string // HomeRoot
	runner *recorder
	driver func() *LinuxUser
}

func newLinuxUserEnv(t *testing.T) *linuxUserEnv {
	t.Helper()
	requireRoot(t)
	// Homes must be reachable by the users (t.TempDir's parents are 0700).
	homes, err := os.MkdirTemp("/home", "gantry-test-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(homes, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(homes) })
	e := &linuxUserEnv{dir: t.TempDir(), homes: homes, runner: &recorder{}}
	e.driver = func() *LinuxUser {
		// The mock GPUs have no driver directory: no device policy, on any host.
		return &LinuxUser{HomeRoot: homes, Runner: e.runner, NvidiaGPUsDir: filepath.Join(e.dir, "no-nvidia"), Logger: logger(t)}
	}
	return e
}

func (e *linuxUserEnv) open(t *testing.T, inv Inventory) *Runtime {
	t.Helper()
	r, err := New(Options{Driver: e.driver(), StateDir: e.dir, Inventory: inv, AdvertiseHost: "gpu-01.example", StopGrace: 300 * time.Millisecond, Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// cleanupUser removes the account should the test end before its release.
func cleanupUser(t *testing.T, name string) {
	t.Cleanup(func() {
		if exec.Command("getent", "passwd", name).Run() == nil {
			_ = exec.Command("pkill", "-KILL", "-u", name).Run()
			time.Sleep(100 * time.Millisecond)
			if out, err := exec.Command("userdel", "--remove", name).CombinedOutput(); err != nil {
				t.Logf("cleanup userdel %s: %v %s", name, err, out)
			}
		}
	})
}

func getent(t *testing.T, db, name string) []string {
	t.Helper()
	out, err := exec.Command("getent", db, name).Output()
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimSpace(string(out)), ":")
}

func owner(t *testing.T, path string) (uid uint32, mode fs.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Uid, fi.Mode()
}

// TestLinuxUserCycle runs the linux-user runtime for real: the account with its keys
// and environment, a login shell that sees only the allocated GPU, stop locking the
// account and killing a process running as the user (one that ignores SIGTERM), restart
// unlocking it, redeliveries (also after an agent restart) not running useradd again,
// and release removing account and home.
func TestLinuxUserCycle(t *testing.T) {
	e := newLinuxUserEnv(t)
	gpus := mockGPUs(t)
	inv := inventory(t, gpus)
	ctx := context.Background()
	r := e.open(t, gpus)
	p := payload(t, inv, 3)
	cleanupUser(t, p.User)

	res, err := r.Provision(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if res != (alloctask.ProvisionResult{Host: "gpu-01.example", Port: 22, User: p.User}) {
		t.Fatalf("result %+v", res)
	}
	pw := getent(t, "passwd", p.User)
	home := filepath.Join(e.homes, p.User)
	if pw == nil || pw[4] != "gantry allocation "+p.AllocationID || pw[5] != home || pw[6] != "/bin/bash" {
		t.Fatalf("passwd %v", pw)
	}
	uid64, _ := strconv.ParseUint(pw[2], 10, 32)
	uid := uint32(uid64)
	for path, want := range map[string]struct {
		uid  uint32
		mode fs.FileMode
	}{
		home:                        {uid, fs.ModeDir | 0o700},
		filepath.Join(home, ".ssh"): {uid, fs.ModeDir | 0o700},
		filepath.Join(home, ".ssh/authorized_keys"): {uid, 0o600},
		filepath.Join(home, ".gantry"):              {0, fs.ModeDir | 0o755},
		filepath.Join(home, ".gantry/env"):          {0, 0o644},
	} {
		if u, m := owner(t, path); u != want.uid || m != want.mode {
			t.Errorf("%s: uid %d mode %v, want uid %d mode %v", path, u, m, want.uid, want.mode)
		}
	}
	keys, _ := os.ReadFile(filepath.Join(home, ".ssh/authorized_keys"))
	if !slices.Equal(nonComment(string(keys)), p.SSHPublicKeys) {
		t.Fatalf("authorized_keys %q", keys)
	}
	gpuUUID := inv.GPUs[3].UUID
	if env := parseEnvFile(t, filepath.Join(home, ".gantry/env")); env["CUDA_VISIBLE_DEVICES"] != gpuUUID || env["NVIDIA_VISIBLE_DEVICES"] != gpuUUID || env["HOME"] != home {
		t.Fatalf("env file %v", env)
	}
	// A login shell of the user gets the restriction from ~/.profile.
	out, err := exec.Command("runuser", "-l", p.User, "-c", `echo "$CUDA_VISIBLE_DEVICES|$NVIDIA_VISIBLE_DEVICES|$CUDA_DEVICE_ORDER|$GANTRY_ALLOCATION_ID|$(id -un)"`).CombinedOutput()
	if want := gpuUUID + "|" + gpuUUID + "|PCI_BUS_ID|" + p.AllocationID + "|" + p.User; err != nil || strings.TrimSpace(string(out)) != want {
		t.Fatalf("login shell: %v %q, want %q", err, out, want)
	}
	s, ok := r.Session(p.AllocationID)
	if !ok || !s.RealUser || s.UID != uid || s.Dir != home || s.Shell != "/bin/bash" || envMap(s.Env)["CUDA_VISIBLE_DEVICES"] != gpuUUID {
		t.Fatalf("session %+v", s)
	}

	// Redelivered provision, then again after an agent restart: useradd ran once.
	if again, err := r.Provision(ctx, p); err != nil || again != res {
		t.Fatalf("second provision %+v %v", again, err)
	}
	r = e.open(t, gpus)
	if again, err := r.Provision(ctx, p); err != nil || again != res {
		t.Fatalf("provision after agent restart %+v %v", again, err)
	}
	if n := e.runner.count("useradd"); n != 1 {
		t.Fatalf("useradd ran %d times", n)
	}

	// Stop: the account is locked and its process (deaf to SIGTERM) is killed.
	stubborn := start(t, exec.Command("runuser", "-u", p.User, "--", "sh", "-c", `trap "" TERM; exec sleep 300`))
	waitFound(t, stubbornPID(t, uid), func() ([]int, error) { return uidPIDs("/proc", uid) })
	if err := r.Stop(ctx, p); err != nil {
		t.Fatal(err)
	}
	stubborn.ended(t)
	if pids, _ := uidPIDs("/proc", uid); len(pids) != 0 {
		t.Fatalf("processes of the user after stop: %v", pids)
	}
	if sh := getent(t, "shadow", p.User); sh == nil || sh[7] != "1" {
		t.Fatalf("shadow after stop %v (want expired)", sh)
	}
	if pw := getent(t, "passwd", p.User); pw[6] != nologin() {
		t.Fatalf("shell after stop %s", pw[6])
	}
	if _, ok := r.Session(p.AllocationID); ok {
		t.Fatal("session of a stopped allocation")
	}
	if err := r.Stop(ctx, p); err != nil { // redelivered
		t.Fatal(err)
	}
	if n := e.runner.count("usermod --expiredate 1"); n != 1 {
		t.Fatalf("locked %d times", n)
	}

	// Restart: unlocked, files re-applied.
	if _, err := r.Restart(ctx, p); err != nil {
		t.Fatal(err)
	}
	if sh := getent(t, "shadow", p.User); sh[7] != "" {
		t.Fatalf("expiry after restart %q", sh[7])
	}
	if pw := getent(t, "passwd", p.User); pw[6] != "/bin/bash" || pw[2] != strconv.FormatUint(uint64(uid), 10) {
		t.Fatalf("passwd after restart %v", pw)
	}
	if out, err := exec.Command("runuser", "-l", p.User, "-c", "echo $CUDA_VISIBLE_DEVICES").CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != gpuUUID {
		t.Fatalf("login after restart: %v %q", err, out)
	}

	// Release: processes, account and home gone; again is fine.
	sleeper := start(t, exec.Command("runuser", "-u", p.User, "--", "sleep", "300"))
	waitFound(t, stubbornPID(t, uid), func() ([]int, error) { return uidPIDs("/proc", uid) })
	if err := r.Release(ctx, p); err != nil {
		t.Fatal(err)
	}
	sleeper.ended(t)
	if pw := getent(t, "passwd", p.User); pw != nil {
		t.Fatalf("account after release %v", pw)
	}
	if _, err := os.Stat(home); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("home after release: %v", err)
	}
	if err := r.Release(ctx, p); err != nil {
		t.Fatalf("second release: %v", err)
	}
	if _, err := r.Provision(ctx, p); code(err) != alloctask.CodeNotFound {
		t.Fatalf("provision after release: %v", err)
	}
	if pw := getent(t, "passwd", p.User); pw != nil {
		t.Fatal("a refused provision created the account")
	}
}

// stubbornPID waits for the first process of uid to appear and returns its pid.
func stubbornPID(t *testing.T, uid uint32) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if pids, err := uidPIDs("/proc", uid); err == nil && len(pids) > 0 {
			return pids[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no process of uid %d appeared", uid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLinuxUserRefusesForeignAccount: an account with the runtime user's name that the
// runtime did not create is neither used nor deleted.
func TestLinuxUserRefusesForeignAccount(t *testing.T) {
	e := newLinuxUserEnv(t)
	gpus := mockGPUs(t)
	r := e.open(t, gpus)
	p := payload(t, inventory(t, gpus), 0)
	cleanupUser(t, p.User)
	if out, err := exec.Command("useradd", "--comment", "someone else", p.User).CombinedOutput(); err != nil {
		t.Fatalf("useradd: %v %s", err, out)
	}
	if _, err := r.Provision(context.Background(), p); code(err) != alloctask.CodeRuntimeFailed || !strings.Contains(err.Error(), "not allocation") {
		t.Fatalf("provision over a foreign account: %v", err)
	}
	if r.Phase(p.AllocationID) != PhaseNone {
		t.Fatalf("phase %q", r.Phase(p.AllocationID))
	}
	if err := r.Release(context.Background(), p); code(err) != alloctask.CodeRuntimeFailed {
		t.Fatalf("release of a foreign account: %v", err)
	}
	if pw := getent(t, "passwd", p.User); pw == nil || pw[4] != "someone else" {
		t.Fatalf("foreign account changed: %v", pw)
	}
}

// TestLinuxUserHomeLinksAreNotFollowed: links the user plants in the home (~/.ssh to
// /etc, ~/.bashrc to a root file) make a restart neither write outside the home nor copy
// a root file into the user's reach.
func TestLinuxUserHomeLinksAreNotFollowed(t *testing.T) {
	e := newLinuxUserEnv(t)
	gpus := mockGPUs(t)
	r := e.open(t, gpus)
	ctx := context.Background()
	p := payload(t, inventory(t, gpus), 1)
	cleanupUser(t, p.User)
	if _, err := r.Provision(ctx, p); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(e.homes, p.User)
	// Beside the homes: a hard link needs the same file system.
	secret := filepath.Join(e.homes, "root-secret")
	if err := os.WriteFile(secret, []byte("root only\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	must(t, os.RemoveAll(filepath.Join(home, ".ssh")))
	must(t, os.Symlink(outside, filepath.Join(home, ".ssh")))
	must(t, os.Remove(filepath.Join(home, ".bashrc")))
	must(t, os.Symlink(secret, filepath.Join(home, ".bashrc")))
	must(t, os.Remove(filepath.Join(home, ".profile")))
	must(t, os.Link(secret, filepath.Join(home, ".profile")))

	if _, err := r.Restart(ctx, p); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("wrote through the ~/.ssh link: %v", entries)
	}
	if fi, err := os.Lstat(filepath.Join(home, ".ssh")); err != nil || !fi.IsDir() {
		t.Fatalf("~/.ssh is not a directory again: %v %v", fi, err)
	}
	if keys, _ := os.ReadFile(filepath.Join(home, ".ssh/authorized_keys")); !slices.Equal(nonComment(string(keys)), p.SSHPublicKeys) {
		t.Fatalf("authorized_keys %q", keys)
	}
	if b, _ := os.ReadFile(secret); string(b) != "root only\n" {
		t.Fatalf("root file changed: %q", b)
	}
	if u, m := owner(t, secret); u != 0 || m != 0o600 {
		t.Fatalf("root file now uid %d mode %v", u, m)
	}
	// ~/.profile may still be the (root-owned, 0600) link; no file the user owns may
	// hold the root file's content.
	for _, rc := range []string{".profile", ".bashrc"} {
		path := filepath.Join(home, rc)
		b, err := os.ReadFile(path)
		if u, _ := owner(t, path); err == nil && u != 0 && strings.Contains(string(b), "root only") {
			t.Fatalf("the root file's content was copied into ~/%s, owned by uid %d", rc, u)
		}
	}
	if err := r.Release(ctx, p); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(secret); err != nil {
		t.Fatalf("release removed a file outside the home: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
