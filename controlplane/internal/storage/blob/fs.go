package blob

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"syscall"
	"time"
)

// tempPrefix starts the name of a file being written. ValidKey refuses elements that
// start with a dot, so a temp file is never an object and RemoveStaleTemps can tell them
// apart by name alone.
const tempPrefix = ".put-"

// FS stores objects as files under one directory, every access through an os.Root.
type FS struct {
	dir  string
	root *os.Root
}

var _ Driver = (*FS)(nil)
var _ Inventory = (*FS)(nil)
var _ TempSweeper = (*FS)(nil)

// NewFS opens (creating it when missing) the directory dir as the driver's root.
func NewFS(dir string) (*FS, error) {
	if dir == "" {
		return nil, errors.New("blob: fs driver needs a root directory (GANTRY_STORAGE_FS_ROOT)")
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("blob: fs root: %w", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("blob: fs root: %w", err)
	}
	return &FS{dir: dir, root: root}, nil
}

func (d *FS) Name() string { return "fs" }

// Dir is the root directory.
func (d *FS) Dir() string { return d.dir }

func (d *FS) Close() error { return d.root.Close() }

// Check reports whether the root directory is still there and usable.
func (d *FS) Check(ctx context.Context) error {
	if _, err := d.root.Stat("."); err != nil {
		return fmt.Errorf("blob: fs root %s: %w", d.dir, err)
	}
	return nil
}

func (d *FS) Put(ctx context.Context, key string, r io.Reader, size int64) (PutResult, error) {
	if err := checkKey(key); err != nil {
		return PutResult{}, err
	}
	dir := path.Dir(key)
	if err := d.root.MkdirAll(dir, 0o750); err != nil {
		return PutResult{}, fmt.Errorf("blob: fs put %s: %w", key, err)
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := dir + "/" + tempPrefix + path.Base(key) + "-" + hex.EncodeToString(rnd[:])
	f, err := d.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
	if err != nil {
		return PutResult{}, fmt.Errorf("blob: fs put %s: %w", key, err)
	}
	committed := false
	defer func() {
		if !committed {
			f.Close()
			_ = d.root.Remove(tmp)
		}
	}()
	in := newIntake(ctx, r, size)
	if _, err := Copy(f, in); err != nil {
		if ierr := in.streamErr(); ierr != nil {
			return PutResult{}, ierr
		}
		return PutResult{}, fmt.Errorf("blob: fs put %s: %w", key, err)
	}
	if err := in.done(); err != nil {
		return PutResult{}, err
	}
	// Durable before visible: the rename must never expose a file whose bytes a crash
	// could still lose.
	if err := f.Sync(); err != nil {
		return PutResult{}, fmt.Errorf("blob: fs put %s: %w", key, err)
	}
	if err := f.Close(); err != nil {
		return PutResult{}, fmt.Errorf("blob: fs put %s: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return PutResult{}, err
	}
	if err := d.root.Rename(tmp, key); err != nil {
		return PutResult{}, fmt.Errorf("blob: fs put %s: %w", key, err)
	}
	committed = true
	// The rename itself is durable once the directory is synced; a failure here leaves a
	// complete object that a crash might forget, which the caller's database row (written
	// after Put) does not yet point at.
	if df, err := d.root.Open(dir); err == nil {
		_ = df.Sync()
		df.Close()
	}
	return in.result(), nil
}

func (d *FS) Open(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	f, err := d.root.Open(key)
	if err != nil {
		return nil, d.mapErr("open", key, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, d.mapErr("open", key, err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, ErrNotFound
	}
	n, err = span(fi.Size(), off, n)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &fileRange{SectionReader: io.NewSectionReader(f, off, n), f: f}, nil
}

type fileRange struct {
	*io.SectionReader
	f *os.File
}

func (r *fileRange) Close() error { return r.f.Close() }

// FileSection hands out the open file and the section Open was asked for (see
// FileSection): a server can give those to the kernel instead of reading them.
func (r *fileRange) FileSection() (*os.File, int64, int64) {
	_, off, n := r.SectionReader.Outer()
	return r.f, off, n
}

func (d *FS) Stat(ctx context.Context, key string) (Info, error) {
	if err := checkKey(key); err != nil {
		return Info{}, err
	}
	fi, err := d.root.Stat(key)
	if err != nil {
		return Info{}, d.mapErr("stat", key, err)
	}
	if !fi.Mode().IsRegular() {
		return Info{}, ErrNotFound
	}
	return Info{Size: fi.Size()}, nil
}

func (d *FS) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	err := d.root.Remove(key)
	if err == nil || errors.Is(d.mapErr("delete", key, err), ErrNotFound) {
		return nil
	}
	return fmt.Errorf("blob: fs delete %s: %w", key, err)
}

// mapErr turns "no such file" (also "a parent is not a directory") into ErrNotFound; every
// other error, including os.Root's refusal to follow a link out of the root, stays an error.
func (d *FS) mapErr(op, key string, err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return ErrNotFound
	}
	return fmt.Errorf("blob: fs %s %s: %w", op, key, err)
}

// Inventory lists every file and link under the root (objects and temp files), sorted.
func (d *FS) Inventory(ctx context.Context) ([]string, error) {
	var names []string
	err := fs.WalkDir(d.root.FS(), ".", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !e.IsDir() {
			names = append(names, p)
		}
		return ctx.Err()
	})
	sort.Strings(names)
	return names, err
}

// RemoveStaleTemps deletes temp files last written before cutoff (see TempSweeper).
func (d *FS) RemoveStaleTemps(ctx context.Context, cutoff time.Time) (int, error) {
	removed := 0
	err := fs.WalkDir(d.root.FS(), ".", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !e.Type().IsRegular() || !strings.HasPrefix(e.Name(), tempPrefix) {
			return nil
		}
		fi, err := e.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // finished or cleaned up meanwhile
			}
			return err
		}
		if fi.ModTime().Before(cutoff) {
			if err := d.root.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			removed++
		}
		return nil
	})
	return removed, err
}
