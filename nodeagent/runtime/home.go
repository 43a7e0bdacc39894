package runtime

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// The managed block LinuxUser puts at the top of ~/.profile and ~/.bashrc. At the top,
// because Debian's skeleton .bashrc returns early for non-interactive shells, and the
// environment must reach `ssh host command` too.
const (
	blockBegin = "# >>> gantry: allocation environment (managed by gantry-nodeagent) >>>"
	blockEnd   = "# <<< gantry <<<"
	block      = blockBegin + "\n[ -r \"$HOME/.gantry/env\" ] && . \"$HOME/.gantry/env\"\n" + blockEnd + "\n"
)

// maxRCBytes bounds a shell startup file read for the managed block; a larger one is
// left as it is (the user's own business; the environment is advisory anyway).
const maxRCBytes = 1 << 20

// writeHome writes the allocation's files into the user's home. Everything goes through
// an os.Root on the home, so no path resolves outside it.
func (d *LinuxUser) writeHome(u *passwdEntry, s Spec, env []string) error {
	root, err := os.OpenRoot(u.Home)
	if err != nil {
		return err
	}
	defer root.Close()
	uid, gid := int(u.UID), int(u.GID)
	// The home itself: the user's, private (sshd's StrictModes wants it not writable by
	// others; 0700 keeps other allocations out).
	if err := chownDir(root, ".", 0o700, uid, gid); err != nil {
		return err
	}
	if err := ensureDir(root, ".ssh", 0o700, uid, gid); err != nil {
		return err
	}
	if err := replaceFile(root, ".ssh/authorized_keys", authorizedKeys(s.SSHPublicKeys), 0o600, uid, gid); err != nil {
		return err
	}
	// ~/.gantry is root's, so it reads as managed; the user can still rename it away,
	// which only removes an advisory environment from their own shells.
	if err := ensureDir(root, ".gantry", 0o755, 0, 0); err != nil {
		return err
	}
	if err := replaceFile(root, ".gantry/env", envFile(env), 0o644, 0, 0); err != nil {
		return err
	}
	for _, rc := range []string{".profile", ".bashrc"} {
		if err := ensureBlock(root, rc, uid, gid); err != nil {
			return fmt.Errorf("%s: %w", rc, err)
		}
	}
	return nil
}

// ensureDir makes name a real directory (a symlink or file of that name is removed
// first) with the given mode and owner.
func ensureDir(root *os.Root, name string, mode os.FileMode, uid, gid int) error {
	fi, err := root.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	case !fi.IsDir():
		if err := root.Remove(name); err != nil {
			return err
		}
	}
	if err := root.Mkdir(name, mode); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return chownDir(root, name, mode, uid, gid)
}

// chownDir sets a directory's mode and owner through a descriptor (never by path, which
// the user could swap in between).
func chownDir(root *os.Root, name string, mode os.FileMode, uid, gid int) error {
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Chown(uid, gid); err != nil {
		return err
	}
	return f.Chmod(mode)
}

// replaceFile writes a new file beside name and renames it over name: a link planted at
// name is replaced, never written through.
func replaceFile(root *os.Root, name string, data []byte, mode os.FileMode, uid, gid int) error {
	tmp := filepath.Join(filepath.Dir(name), "."+filepath.Base(name)+".gantry-new")
	if err := root.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chown(uid, gid)
	}
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = root.Remove(tmp)
		return err
	}
	return root.Rename(tmp, name)
}

// ensureBlock puts the managed block at the top of a shell startup file unless it is
// there. A missing file is created with just the block; anything that is not a regular
// file of reasonable size owned by the user is left alone (root must not copy, say, a
// hard link to /etc/shadow into a file the user can read).
func ensureBlock(root *os.Root, name string, uid, gid int) error {
	old, err := readRegular(root, name, maxRCBytes, uid)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		old = nil
	case errors.Is(err, errNotRegular), errors.Is(err, errTooLarge):
		return nil
	case err != nil:
		return err
	}
	if bytes.Contains(old, []byte(blockBegin)) {
		return nil
	}
	return replaceFile(root, name, append([]byte(block), old...), 0o644, uid, gid)
}

// Why readRegular refused a file.
var (
	errNotRegular = errors.New("not a regular file owned by the user")
	errTooLarge   = errors.New("file too large")
)

// readRegular reads name if it is a regular file owned by uid with one link, no larger
// than limit. It opens without blocking (a FIFO planted there cannot hang the agent); a
// name that cannot be opened inside the root (a symlink leading out of the home) counts
// as not regular.
func readRegular(root *os.Root, name string, limit int64, uid int) ([]byte, error) {
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		return nil, errNotRegular
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.Mode().IsRegular() || !ok || int(st.Uid) != uid || st.Nlink != 1 {
		return nil, errNotRegular
	}
	if fi.Size() > limit {
		return nil, errTooLarge
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, errTooLarge
	}
	return b, nil
}
